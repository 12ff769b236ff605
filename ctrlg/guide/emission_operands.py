"""The layouts of an HMM's emission matrix that every guide table of that HMM shares, built once.

:class:`ctrlg.guide.tables.GuideTables` needs, besides its DFA's own operands, four views of the
emission B [h, V] that depend on the HMM alone:

* Bᵀ, contiguous [V, h] float32 — per-token columns as rows (gathers, the forward update);
* Bᵀ in the product precision, packed once for oneDNN (:class:`PackedLinear`) — the dense
  [R, h]·[h, V] product of every guided token; over the support's columns only, plus a rank-1
  term, when the emission's other columns share one profile (``topk8-K`` checkpoints;
  :mod:`ctrlg.guide.factored_emission`);
* min_v B[z, v] [h] — the underflow bound of :mod:`ctrlg.guide.token_weights`;
* rowsum(B) [h] in float64 — the non-exception mass M_s of the backward recurrence;
* the sums of B's columns over large letters (token classes) that tables have needed
  (:class:`ctrlg.guide.letter_sums.LargeLetterSums`), so the next table's similar letter is a
  difference instead of a sum over ≈ 16,000 columns;
* the lazy guide's pair sums of the token groups it has met
  (:class:`ctrlg.guide.letter_sums.GroupSumsMemo`), which recur schema after schema.

Building them reads and writes all h·V entries several times (≈ 0.5 s at h = 512, V = 49,152 on
one CPU core) and holds two h·V copies; a table per DFA used to build its own, so a batch of ten
CommonGen items built and held ten. They are now kept per (HMM, precision): weakly on the HMM
(a dropped HMM frees them) and keyed on the emission tensor's storage, shape, dtype, device
and version counter, so an emission changed in place (EM) or replaced builds them again.
:func:`transition_operands` keeps the transition's float32 copy and contiguous transpose the same
way (the lazy guide's products; a guide per schema used to copy Aᵀ), and
:func:`completion_memo` the lazy guide's completion weights β
(:class:`ctrlg.guide.completion_memo.CompletionMemo`), which depend on both A and B.
:func:`host_copy` gives the lazy guide, which computes on the CPU, a CPU copy of an HMM that
lives on a GPU (once per HMM and version, so guides of one HMM share it and its caches).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ctrlg.guide.completion_memo import CompletionMemo
from ctrlg.guide.factored_emission import FactoredProduct, emission_product
from ctrlg.guide.letter_sums import GroupSumsMemo, LargeLetterSums
from ctrlg.kernels.packed_linear import PackedLinear

__all__ = ["EmissionOperands", "HostHMM", "completion_memo", "emission_operands", "host_copy",
           "transition_operands"]

# HMM → {key: EmissionOperands}; only the entries of the emission's current version are kept
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# HMM → (the transition's version key, (A float32, Aᵀ contiguous))
_TRANSITIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# HMM → (the transition's and the emission's version keys, CompletionMemo)
_COMPLETIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# HMM → (its three parameters' version keys, HostHMM)
_HOST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class EmissionOperands:
    """The HMM-only operands of the guide (module docstring)."""

    emission_t: torch.Tensor       # Bᵀ [V, h] float32, contiguous
    emission_low: torch.Tensor     # Bᵀ in the product dtype (the same tensor for float32)
    product: PackedLinear | FactoredProduct   # x ↦ x · B, packed once (factored: a rank-1 tail)
    emission_min: torch.Tensor     # min_v B[z, v] [h] float32
    row_sum: torch.Tensor          # Σ_v B[z, v] [h] float64
    large_letters: LargeLetterSums  # sums of large letters (tables), filled as tables need them
    group_sums: GroupSumsMemo       # the lazy guide's pair sums, by their groups


def _version_key(tensor: torch.Tensor) -> tuple:
    return (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, str(tensor.device),
            tensor._version)


def _build(emission: torch.Tensor, dtype: torch.dtype) -> EmissionOperands:
    B = emission.float()
    emission_t = B.T.contiguous()
    low = emission_t.to(dtype)
    return EmissionOperands(emission_t=emission_t, emission_low=low,
                            product=emission_product(low, emission_t),
                            emission_min=low.float().amin(0), row_sum=B.double().sum(1),
                            large_letters=LargeLetterSums(emission_t),
                            group_sums=GroupSumsMemo())


def emission_operands(hmm, dtype: torch.dtype) -> EmissionOperands:
    """The shared operands of ``hmm``'s emission with products in ``dtype`` (built on first use;
    an HMM object that cannot be weakly referenced gets them built every time)."""
    emission = hmm.emission
    version = _version_key(emission)
    try:
        per_hmm = _CACHE.setdefault(hmm, {})
    except TypeError:          # not weak-referenceable: no cache
        return _build(emission, dtype)
    for stale in [k for k in per_hmm if k[1:] != version]:
        del per_hmm[stale]
    key = (dtype, *version)
    if key not in per_hmm:
        per_hmm[key] = _build(emission, dtype)
    return per_hmm[key]


def _kept_per_hmm(cache: "weakref.WeakKeyDictionary", hmm, version: tuple, build):
    """``build()``, kept weakly per HMM in ``cache`` under ``version`` and built again when the
    version changes; an HMM that cannot be weakly referenced gets ``build()`` every time."""
    try:
        got = cache.get(hmm)
    except TypeError:                 # not weak-referenceable: no cache
        return build()
    if got is None or got[0] != version:
        got = (version, build())
        cache[hmm] = got
    return got[1]


def transition_operands(hmm) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, Aᵀ)`` of ``hmm`` in float32, Aᵀ contiguous (the lazy guide's products): built once
    per HMM and again when the transition is replaced or changed in place (the same version key
    as the emission's operands); an HMM that cannot be weakly referenced gets them built every
    time."""
    A = hmm.transition

    def build():
        a = A.float()
        return a, a.T.contiguous()

    return _kept_per_hmm(_TRANSITIONS, hmm, _version_key(A), build)


def completion_memo(hmm, transition: np.ndarray, emission_t: np.ndarray) -> CompletionMemo:
    """The lazy guides' shared memo of completion weights for ``hmm``, computing with
    ``transition`` (A [h, h]) and ``emission_t`` (Bᵀ [V, h]), float32 numpy arrays of ``hmm``'s
    current A and B: one memo per HMM, emptied when either is replaced or changed in place (the
    version keys above); an HMM that cannot be weakly referenced gets a new memo every time."""
    version = (_version_key(hmm.transition), _version_key(hmm.emission))
    return _kept_per_hmm(_COMPLETIONS, hmm, version,
                         lambda: CompletionMemo(transition, emission_t))


class HostHMM:
    """π [h], A [h, h] and B [h, V] of an HMM copied to CPU memory: what a guide that computes
    on the CPU reads (:func:`host_copy`)."""

    def __init__(self, hmm):
        self.initial, self.transition, self.emission = (
            t.detach().to("cpu", copy=True) for t in (hmm.initial, hmm.transition, hmm.emission))

    @property
    def hidden_size(self) -> int:
        return self.transition.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.emission.shape[1]


def _in_host_memory(tensors) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def host_copy(hmm):
    """``hmm`` itself when π, A and B are in CPU memory; else its :class:`HostHMM`, built once
    per HMM and again when a parameter is replaced or changed in place (the version keys above),
    so the guides of one GPU HMM share the copy and the caches keyed on it."""
    params = (hmm.initial, hmm.transition, hmm.emission)
    if _in_host_memory(params):
        return hmm
    version = tuple(_version_key(t) for t in params)
    return _kept_per_hmm(_HOST, hmm, version, lambda: HostHMM(hmm))
