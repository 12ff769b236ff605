"""A KV cache that grows in place: one token's write per step instead of a copy of the whole cache.

transformers' ``DynamicLayer`` appends a step's keys and values with ``torch.cat``, so a step at
cache length L copies all L cached positions of every layer: O(L) bytes per step, O(L²) over a
sequence (on a 2-core CPU, a 4-row step of SmolLM2-135M at L ≈ 100 spends ≈ 10 % of its time
in those copies). :class:`GrowingLayer` keeps keys and values in a buffer [B, H, C, D] with spare
capacity C ≥ L and writes the new positions into it; ``update`` returns the views [:, :, :L]
(no copy: attention reads them through their strides). When a step would exceed C the buffer is
reallocated at twice the need (amortised O(1) copies per position). Reordering the batch
(``batch_select_indices``, ``batch_repeat_interleave``, ``reorder_cache``) and ``crop`` act on
the valid part, as ``DynamicLayer``'s do; the values returned are exactly ``DynamicLayer``'s.

:class:`GrowingCache` is a ``DynamicCache`` made of such layers (created lazily, one per
decoder layer, as ``DynamicCache()`` does). It suits decoders whose layers are all full
attention (Llama and most small LMs); a model with sliding-window layers should keep its own
cache class.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["GrowingLayer", "GrowingCache"]

#: the first buffer holds this many positions more than the first update brings
INITIAL_SPARE = 64


class GrowingLayer(DynamicLayer):
    """One decoder layer's keys and values, [B, H, L, D] views of buffers of capacity C ≥ L."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self.length = 0

    def _reserve(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Buffers of capacity ≥ ``needed`` positions holding the valid part."""
        if self._key_buffer is not None and self._key_buffer.shape[-2] >= needed:
            return
        capacity = max(needed + INITIAL_SPARE, 2 * needed) if self._key_buffer is None else 2 * needed
        buffers = []
        for old, new in ((self._key_buffer, key_states), (self._value_buffer, value_states)):
            shape = (*new.shape[:-2], capacity, new.shape[-1])
            buffer = torch.empty(shape, dtype=new.dtype, device=new.device)
            if old is not None and self.length:
                buffer[..., :self.length, :] = old[..., :self.length, :]
            buffers.append(buffer)
        self._key_buffer, self._value_buffer = buffers

    def _views(self) -> None:
        self.keys = self._key_buffer[..., :self.length, :]
        self.values = self._value_buffer[..., :self.length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._key_buffer is not None and self._key_buffer.shape[0] != key_states.shape[0]:
            raise ValueError(f"the cache holds {self._key_buffer.shape[0]} rows, the step brings "
                             f"{key_states.shape[0]}")
        start, end = self.length, self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def _rebuild(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Fresh buffers holding ``keys`` / ``values`` (the valid part after a batch reorder)."""
        self._key_buffer = self._value_buffer = None
        self.length = 0
        if keys.shape[-2]:
            self._reserve(keys.shape[-2], keys, values)
            self._key_buffer[..., :keys.shape[-2], :] = keys
            self._value_buffer[..., :keys.shape[-2], :] = values
            self.length = keys.shape[-2]
            self._views()
        else:
            self.keys, self.values = keys, values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            index = beam_idx.to(self.keys.device)
            self._rebuild(self.keys.index_select(0, index), self.values.index_select(0, index))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._rebuild(self.keys.repeat_interleave(repeats, dim=0),
                          self.values.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._rebuild(self.keys[indices, ...], self.values[indices, ...])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(0, self.length + tokens_to_remove)
        if self._key_buffer is not None:
            self._views()

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self.length = 0
        super().reset()


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` whose layers are :class:`GrowingLayer` (module docstring)."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
