"""One context encoded once and shared by a batch of rows: its key/value cache, broadcast to B
rows without a copy.

Sampling N candidates after a prompt of P tokens, or scoring N candidates after it, encodes the
prompt N times when every row carries it (transformers repeats the input once per returned
sequence; :func:`ctrlg.sampler.lm_log_likelihood` used to pad prompt + candidate per row). With the
prompt's cache computed once and its tensors *expanded* to N rows (stride 0 along the batch, no
copy), the rows run only their own tokens:

    prefill work  N·P·C  →  P·C        (C: the model's cost per token)

and the attention of each row's tokens reads the same prompt keys and values, so every row's
logits equal the unshared run's up to float rounding. The editor's requests (4 candidates after a
prefix of up to 512 tokens) and the editing benchmark's (8 samples) are the callers this is for.

Models whose forward returns no reusable :class:`transformers.DynamicCache` (a cache without
per-layer ``keys``/``values``, or none at all) are reported by :attr:`SharedContext.reusable`;
callers then fall back to encoding the full rows.

:class:`ContextCache` keeps the last few contexts of a model, so that the calls of one request
(sampling, then scoring the samples) and the requests that follow at the same place in a document
(the editor: the writer asks again, or for another mode) encode their prompt once between them.
Sampling shares the prompt but its last token (``generate`` runs that token per row), so the
scores read the same context and run the prompt's last token before each candidate.
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict
from typing import Sequence

import torch

__all__ = ["ContextCache", "SharedContext", "cache_keyword", "returned_cache", "right_padded",
           "shared_prompt_inputs"]


def cache_keyword(model) -> str:
    """The keyword that hands a model (and its ``generate``) a key/value cache: ``cache`` where
    transformers renamed ``past_key_values`` (5.2x; the old name still works there, with a
    FutureWarning), ``past_key_values`` before. Read once per model class (decoding loops ask at
    every step)."""
    return _cache_keyword_of(type(model))


@functools.lru_cache(maxsize=None)
def _cache_keyword_of(model_class: type) -> str:
    try:
        names = inspect.signature(model_class.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in names else "past_key_values"


def returned_cache(output):
    """The key/value cache a forward returned: ``cache`` where transformers renamed it (reading the
    old attribute there logs a deprecation warning), ``past_key_values`` before; None if neither."""
    getter = output.get if hasattr(output, "get") else (lambda name: getattr(output, name, None))
    cache = getter("cache")
    return cache if cache is not None else getter("past_key_values")


def right_padded(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(ids [B, W], attention mask [B, W], lengths) of non-empty token lists, right-padded: the
    continuations :meth:`SharedContext.continuation_logits` reads."""
    lengths = [len(s) for s in sequences]
    ids = torch.zeros(len(sequences), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(sequences):
        ids[r, :len(s)] = torch.tensor([int(t) for t in s])
        mask[r, :len(s)] = 1
    return ids, mask, lengths


class SharedContext:
    """The cache of ``context`` (token ids, non-empty) under ``model``, and the log probabilities of
    the token after it (float32 [V], on the CPU).

    ``cache(batch)`` returns a fresh :class:`transformers.DynamicCache` whose layers are views of the
    one computed here, broadcast to ``batch`` rows; appending to it (the model's ``update``)
    concatenates into new tensors, so the shared one is never written."""

    def __init__(self, model, context: Sequence[int]):
        self.model = model
        self.context = [int(t) for t in context]
        if not self.context:
            raise ValueError("SharedContext needs a non-empty context")
        self.device = next(model.parameters()).device
        self.layers = None
        ids = torch.tensor([self.context], device=self.device)
        with torch.no_grad():
            try:   # transformers models skip the LM head on all but the last position
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            except TypeError:
                out = model(input_ids=ids, use_cache=True)
        self.next_log_probs = torch.log_softmax(out.logits[0, -1].float(), -1).cpu()
        cache = returned_cache(out)
        layers = getattr(cache, "layers", None)
        if layers and all(getattr(layer, "keys", None) is not None
                          and getattr(layer, "values", None) is not None for layer in layers):
            self.layers = [(layer.keys, layer.values) for layer in layers]

    @property
    def reusable(self) -> bool:
        """Whether the model gave a per-layer key/value cache that rows can share."""
        return self.layers is not None

    def cache(self, batch: int):
        """A DynamicCache of the context for ``batch`` rows (module docstring)."""
        from transformers import DynamicCache  # heavy optional dependency: imported on first use

        if self.layers is None:
            raise RuntimeError("this model returned no reusable cache (check .reusable first)")
        return DynamicCache([(k.expand(batch, *k.shape[1:]), v.expand(batch, *v.shape[1:]))
                             for k, v in self.layers], config=self.model.config)

    @torch.no_grad()
    def continuation_logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, W, V] at the positions of right-padded continuations ``ids`` [B, W] (``mask``
        marks their real tokens) after the context: the shared cache when :attr:`reusable`, else
        the full sequences re-encoded."""
        n, batch = len(self.context), len(ids)
        full_mask = torch.cat([torch.ones(batch, n, dtype=torch.long), mask.cpu()], 1).to(self.device)
        if self.layers is None:
            full = torch.cat([torch.tensor([self.context]).expand(batch, n), ids.cpu()], 1)
            return self.model(input_ids=full.to(self.device), attention_mask=full_mask).logits[:, n:]
        return self.model(input_ids=ids.to(self.device), attention_mask=full_mask, use_cache=True,
                          **{cache_keyword(self.model): self.cache(batch)}).logits


class ContextCache:
    """The last ``capacity`` :class:`SharedContext` objects, by (model, context ids), least recently
    used dropped first. A context is a pure function of the model's weights and the ids, so a hit
    returns exactly what encoding again would; a model whose weights change in place (training,
    merging an adapter) needs :meth:`clear`. Memory: each entry holds one row's keys and values,
    2 · layers · kv_heads · head_dim · tokens numbers (SmolLM2-135M: 23.6 MB at 512 tokens, float32)."""

    def __init__(self, capacity: int = 2):
        if capacity < 1:
            raise ValueError(f"ContextCache needs capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[tuple, SharedContext] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, model, context: Sequence[int]) -> SharedContext:
        key = (id(model), tuple(int(t) for t in context))
        found = self._entries.get(key)
        if found is not None and found.model is model:
            self._entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        found = SharedContext(model, key[1])
        self._entries[key] = found
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return found

    def clear(self) -> None:
        self._entries.clear()


def shared_prompt_inputs(model, prompt_ids: Sequence[int], rows: int,
                         contexts: ContextCache | None = None) -> dict | None:
    """``generate`` keywords that sample ``rows`` sequences after one prompt with its cache shared
    (module docstring): ``input_ids`` and ``attention_mask`` of the rows, ``num_return_sequences=1``
    and the cache of all but the prompt's last token (``generate`` runs that token per row, which
    gives the first step's logits). None when there is nothing to share (one row, a one-token
    prompt) or the model gives no reusable cache; then call ``generate`` as usual."""
    prompt = [int(t) for t in prompt_ids]
    if rows < 2 or len(prompt) < 2:
        return None
    context = (SharedContext(model, prompt[:-1]) if contexts is None
               else contexts.get(model, prompt[:-1]))
    if not context.reusable:
        return None
    input_ids = torch.tensor([prompt], device=context.device).expand(rows, -1).contiguous()
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "num_return_sequences": 1, cache_keyword(model): context.cache(rows)}
