"""Peak throughput of known GPUs and the fraction of peak a measurement reaches.

Source: the vendors' datasheets (NVIDIA H100 Tensor Core GPU datasheet, NVIDIA H200 Tensor Core
GPU datasheet, NVIDIA A100 Tensor Core GPU datasheet). Tensor-core figures are *dense* (without
2:4 structured sparsity, i.e. half the datasheet's "with sparsity" numbers); ``fp32`` is the
non-tensor-core FP32 rate. Memory bandwidth is the HBM figure of the same datasheet.

=============  ==========  ==========  ==========  ===========
device         bf16 dense  tf32 dense  fp32        HBM
=============  ==========  ==========  ==========  ===========
H100 SXM       989 TF/s    494.5 TF/s  67 TF/s     3.35 TB/s
H200 (SXM)     989 TF/s    494.5 TF/s  67 TF/s     4.8 TB/s
H100 PCIe      756 TF/s    378 TF/s    51 TF/s     2.0 TB/s
A100 (SXM)     312 TF/s    156 TF/s    19.5 TF/s   2.039 TB/s
=============  ==========  ==========  ==========  ===========

``torch.cuda.get_device_name`` reports e.g. "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe",
"NVIDIA H200"; :func:`peak_for` matches those names. CPUs and unknown GPUs have no entry: their
fractions of peak are ``None``.

fraction of peak = achieved FLOP/s / peak FLOP/s (per precision), and
fraction of bandwidth = modelled bytes moved / time / peak bytes/s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Peak", "PEAKS", "PEAK_SOURCE", "peak_for", "fractions_of_peak", "fraction_of_bandwidth"]

PEAK_SOURCE = ("vendor datasheets: NVIDIA H100 / H200 / A100 Tensor Core GPU datasheets; dense "
               "tensor-core rates (no 2:4 sparsity), fp32 = non-tensor-core rate")


@dataclass(frozen=True)
class Peak:
    """Peak rates of one device: FLOP/s per precision and memory bytes/s."""

    name: str
    bf16_flops: float
    tf32_flops: float
    fp32_flops: float
    hbm_bytes_per_s: float

    def as_dict(self) -> dict:
        return asdict(self)


_T = 1e12
PEAKS: dict[str, Peak] = {
    "H100 SXM": Peak("H100 SXM", 989 * _T, 494.5 * _T, 67 * _T, 3.35e12),
    "H200": Peak("H200", 989 * _T, 494.5 * _T, 67 * _T, 4.8e12),
    "H100 PCIe": Peak("H100 PCIe", 756 * _T, 378 * _T, 51 * _T, 2.0e12),
    "A100": Peak("A100", 312 * _T, 156 * _T, 19.5 * _T, 2.039e12),
}


def peak_for(device_name: str | None) -> Peak | None:
    """The :class:`Peak` for a device name as CUDA reports it, or ``None`` (CPU, unknown GPU)."""
    if not device_name:
        return None
    name = device_name.upper()
    if "H200" in name:
        return PEAKS["H200"]
    if "H100" in name:
        return PEAKS["H100 PCIe"] if "PCIE" in name else PEAKS["H100 SXM"]
    if "A100" in name:
        return PEAKS["A100"]
    return None


def fractions_of_peak(flops_per_s: float, peak: Peak | None) -> dict[str, float] | None:
    """Achieved FLOP/s over each precision's peak (``{"bf16": …, "tf32": …, "fp32": …}``), or
    ``None`` without a peak."""
    if peak is None:
        return None
    return {"bf16": flops_per_s / peak.bf16_flops, "tf32": flops_per_s / peak.tf32_flops,
            "fp32": flops_per_s / peak.fp32_flops}


def fraction_of_bandwidth(bytes_per_s: float, peak: Peak | None) -> float | None:
    """Modelled bytes/s over the HBM peak, or ``None`` without a peak."""
    return None if peak is None else bytes_per_s / peak.hbm_bytes_per_s
