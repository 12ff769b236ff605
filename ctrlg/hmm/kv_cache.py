"""A key/value cache allocated once for a known length, for batched decoding on a CPU.

transformers' ``DynamicCache`` appends each step's keys and values with ``torch.cat``, which copies
the whole cache of every layer at every step: O(B · H_kv · T · D) bytes per layer and step
(~8 % of a distillation sampling step at batch 128, T ≈ 60). :class:`PreallocatedLayer` holds
buffers ``[B, H_kv, capacity, D]`` made once; a step writes its q new positions in place
(O(B · H_kv · q · D)) and hands attention the **whole** buffer. The positions not written yet hold
zeros (finite scores) and must be masked: the caller passes a 2-D attention mask of ``capacity``
columns, 0 beyond the written positions (the causal mask hides them too). Attending over
``capacity`` columns instead of the T written ones costs O(B · H · (capacity − T) · D) more per
layer, far less than the copy it replaces; a view of the first T columns would avoid even that,
but PyTorch's batched bfloat16 matmul copies such strided views, which is slower than ``cat``.

Rows are dropped with :meth:`PreallocatedLayer.batch_select_indices` (one copy of the buffers) as
with ``DynamicCache``.
"""

from __future__ import annotations

import torch

from ctrlg.errors import CtrlgError

__all__ = ["PreallocatedLayer", "preallocated_cache"]


def _layer_base():
    from transformers.cache_utils import DynamicLayer  # heavy import: only when an LM is run

    return DynamicLayer


class PreallocatedLayer(_layer_base()):
    """One layer's cache: ``keys`` / ``values`` [B, H_kv, capacity, D], the first ``length``
    positions written. ``update`` returns the full buffers (mask the unwritten positions)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.keys, self.values, self.length = keys, values, int(length)
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    @classmethod
    def from_states(cls, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> "PreallocatedLayer":
        """A layer whose first ``keys.shape[2]`` positions are ``keys`` / ``values`` [B, H_kv, T, D]."""
        B, H, T, _ = keys.shape
        if capacity < T:
            raise CtrlgError(f"capacity {capacity} is smaller than the {T} cached positions")
        k = keys.new_zeros(B, H, capacity, keys.shape[-1])
        v = values.new_zeros(B, H, capacity, values.shape[-1])
        k[:, :, :T] = keys
        v[:, :, :T] = values
        return cls(k, v, T)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        end = self.length + q
        if end > self.keys.shape[-2]:
            raise CtrlgError(f"the preallocated KV cache holds {self.keys.shape[-2]} positions; "
                             f"{end} were asked for (allocate a larger capacity)")
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0  # attention sees the whole buffer

    def get_max_length(self) -> int:
        return self.keys.shape[-2]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keys, self.values = self.keys[indices], self.values[indices]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.keys = self.keys.repeat_interleave(repeats, dim=0)
        self.values = self.values.repeat_interleave(repeats, dim=0)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a preallocated KV cache is not cropped")

    def reset(self) -> None:
        self.keys.zero_()
        self.values.zero_()
        self.length = 0


def preallocated_cache(cache, capacity: int, batch_size: int | None = None):
    """A ``transformers.Cache`` of :class:`PreallocatedLayer` holding the states of ``cache`` (a
    ``DynamicCache``), each row repeated ``batch_size`` times when given (a batch-1 prefix shared
    by every row), with room for ``capacity`` positions in all."""
    from transformers.cache_utils import Cache

    layers = []
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if batch_size is not None:
            keys = keys.repeat_interleave(batch_size, dim=0)
            values = values.repeat_interleave(batch_size, dim=0)
        layers.append(PreallocatedLayer.from_states(keys, values, capacity))
    return Cache(layers=layers)


def empty_preallocated_cache(model, batch_size: int, capacity: int):
    """A ``transformers.Cache`` of empty :class:`PreallocatedLayer` sized for ``model``'s config."""
    from transformers.cache_utils import Cache

    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    param = next(model.parameters())
    layers = []
    for _ in range(config.num_hidden_layers):
        zeros = torch.zeros(batch_size, heads, capacity, head_dim, dtype=param.dtype, device=param.device)
        layers.append(PreallocatedLayer(zeros, zeros.clone(), 0))
    return Cache(layers=layers)
