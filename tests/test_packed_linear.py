"""The packed emission product equals torch's linear, packed or not."""

import pytest
import torch

from ctrlg.kernels.packed_linear import PackedLinear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(7, 3), (1000, 17), (4099, 64)])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_packed_linear_equals_linear(dtype, shape, rows):
    g = torch.Generator().manual_seed(rows + shape[0])
    weight = torch.rand(shape, generator=g).to(dtype)
    x = torch.rand(rows, shape[1], generator=g, dtype=torch.float64)
    product = PackedLinear(weight)
    got = product(x)
    want = torch.nn.functional.linear(x.to(dtype), weight)
    assert got.dtype == dtype and got.shape == (rows, shape[0])
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=0)
    if dtype == torch.float64:
        assert not product.packed          # oneDNN's packed path is float32 / bfloat16 only


def test_packed_path_is_used_where_onednn_has_it():
    product = PackedLinear(torch.rand(64, 16))
    assert product.packed == torch.backends.mkldnn.is_available()
