"""x · B for an emission whose columns outside a support are one profile: a dense product over the
support plus one rank-1 term.

A ``topk8-K`` emission (:mod:`ctrlg.hmm.quantize`) keeps each row's K largest entries and spreads
the row's remaining mass r_z over the other tokens in proportion to one background u:
B[z, v] = c_z · u_v for every v outside the row's kept set, c_z = r_z / Σ_{w ∉ K_z} u_w. Every
token kept by no row (v ∉ S = ∪_z K_z) therefore has the column B[:, v] = c · u_v, and

    (x B)[:, v] = (x B_S)[:, v]      v ∈ S        (dense [R, h]·[h, |S|])
                = (x c) · u_v        v ∉ S        (one [R, h]·[h] product, then an outer product)

At h = 512, V = 49,152, K = 4,096 the union S holds 21,470 tokens (44 %), so the guide's dense
product, 2·R·h·V multiply-adds per step, shrinks to 2·R·h·|S| plus an O(R·V) outer product.

:func:`rank_one_tail` finds the tail of any emission from its values alone (no format flag): it
takes one of the columns of least total mass as the profile c and keeps the tokens whose column equals
c · u_v to ``TAIL_RTOL`` in every hidden state (float32 rounding of the dequantised float64
emission is ≤ 6e-8 relative). A dense emission (every column different) has no tail and keeps
the plain product. The factored product equals the dense one to that tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctrlg.kernels.packed_linear import PackedLinear

__all__ = ["RankOneTail", "rank_one_tail", "FactoredProduct", "emission_product",
           "TAIL_RTOL", "MIN_TAIL_FRACTION"]

#: A column belongs to the tail when every entry is within this relative distance of c · u_v.
TAIL_RTOL = 1e-6
#: Below this share of the vocabulary in the tail, the dense product is kept (the factored one
#: pays a scatter of the support's columns; it wins only when it saves a good share of B).
MIN_TAIL_FRACTION = 0.2
#: Columns of least mass tried as the tail's profile (a kept token may weigh less than a tail one).
CANDIDATES = 3
_CHUNK = 4096   # tokens per block of the detection pass (bounds its temporary memory)


@dataclass(frozen=True)
class RankOneTail:
    """B[:, v] = profile · weight[v] for every v not in ``support``."""

    support: torch.Tensor   # int64 [|S|], sorted: the tokens with columns of their own
    profile: torch.Tensor   # c [h] float32
    weight: torch.Tensor    # u [V] float32, 0 on the support


def rank_one_tail(emission_t: torch.Tensor, rtol: float = TAIL_RTOL,
                  min_fraction: float = MIN_TAIL_FRACTION) -> RankOneTail | None:
    """The rank-1 tail of the emission Bᵀ [V, h] (float32, non-negative), or None when fewer than
    ``min_fraction`` · V columns share one profile (module docstring). Each of the
    ``CANDIDATES`` columns of least mass is tried as the profile; the largest tail wins.
    O(CANDIDATES · V · h)."""
    V = emission_t.shape[0]
    best = None                                          # (tail size, in_tail, weight, profile)
    for reference in torch.topk(-emission_t.sum(1), min(CANDIDATES, V)).indices.tolist():
        profile = emission_t[reference].float()
        found = _tail_of(emission_t, profile, rtol)
        if found is not None and (best is None or int(found[0].sum()) > best[0]):
            best = (int(found[0].sum()), *found, profile)
    if best is None or best[0] < min_fraction * V:
        return None
    _, in_tail, weight, profile = best
    return RankOneTail(support=(~in_tail).nonzero()[:, 0], profile=profile,
                       weight=torch.where(in_tail, weight, 0.0))


def _tail_of(emission_t: torch.Tensor, profile: torch.Tensor, rtol: float):
    """(bool [V] the columns equal to ``profile`` · u_v, u [V]), or None for a zero profile."""
    V = emission_t.shape[0]
    pivot = int(profile.argmax())
    if float(profile[pivot]) <= 0.0:
        return None
    weight = emission_t[:, pivot].float() / profile[pivot]
    in_tail = torch.empty(V, dtype=torch.bool, device=emission_t.device)
    for lo in range(0, V, _CHUNK):
        block = emission_t[lo:lo + _CHUNK].float()
        expected = weight[lo:lo + _CHUNK, None] * profile[None, :]
        in_tail[lo:lo + _CHUNK] = ((block - expected).abs() <= rtol * expected).all(1)
    return in_tail, weight


class FactoredProduct:
    """x ↦ x · B ([R, h] → [R, V] in the product dtype) as the dense product over the support's
    columns (packed once, :class:`PackedLinear`) plus (x · c) ⊗ u for the tail (module docstring).
    ``emission_low`` is Bᵀ [V, h] in the product dtype."""

    def __init__(self, emission_low: torch.Tensor, tail: RankOneTail):
        self.dtype = emission_low.dtype
        self.support = tail.support
        self._support_product = PackedLinear(emission_low[tail.support].contiguous()) \
            if len(tail.support) else None                           # every column one profile
        self._profile = tail.profile.to(self.dtype)[:, None]       # [h, 1]
        self._weight = tail.weight.to(self.dtype)[None, :]          # [1, V]

    @property
    def packed(self) -> bool:
        return self._support_product is not None and self._support_product.packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        out = torch.empty(x.shape[0], self._weight.shape[1], dtype=self.dtype, device=x.device)
        torch.mm(x @ self._profile, self._weight, out=out)          # the tail, written everywhere
        if self._support_product is None:
            return out
        return out.index_copy_(1, self.support, self._support_product(x))


def emission_product(emission_low: torch.Tensor, emission_t: torch.Tensor):
    """The guide's x ↦ x · B: :class:`FactoredProduct` when Bᵀ ``emission_t`` (float32 [V, h])
    has a rank-1 tail, else :class:`PackedLinear` over ``emission_low`` (Bᵀ in the product dtype)."""
    tail = rank_one_tail(emission_t)
    return PackedLinear(emission_low) if tail is None else FactoredProduct(emission_low, tail)
