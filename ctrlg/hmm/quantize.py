"""8-bit storage of the emission matrix B [h, V]: a larger h in the same checkpoint budget.

Two row-wise schemes (each row i has its own range; rows are renormalised after decoding, so
every decoded row is a distribution):

* ``log8`` — linear codes of log-probabilities: with ℓ = log B[i, v], hi = max_v ℓ and
  lo = max(min_v ℓ, hi − ``LOG_RANGE``), the code is c = round((ℓ − lo) / s), s = (hi − lo)/255,
  and B̂[i, v] ∝ exp(lo + c·s). Every probability keeps its order of magnitude: the relative error
  of an entry is at most e^{s/2} − 1 (≈ 6 % for a 30-nat range) and no entry becomes 0.
* ``normq8`` — Norm-Q (Gao & Yang 2025, arXiv 2509.25439): linear codes of the row normalised by
  its maximum, c = round(255 · B[i, v] / max_v B[i, v]), B̂[i, v] ∝ max(c, ½) · max_v B / 255.
  Entries below max/510 all decode to the same floor (Norm-Q would drop them to 0; the floor
  keeps every token possible, which the guide's ratios P(v, α)/P(v) need).

* ``topk8-K`` (e.g. ``topk8-4096``) — sparse rows for a large h: each row keeps its K largest
  entries, stored as token indices and ``log8`` codes of their log-probabilities, plus the row's
  remaining mass r_i = 1 − Σ_kept B̂; the other tokens share r_i in proportion to one background
  distribution u (the mean emission row, stored once): B̂[i, v] = r_i · u_v / Σ_{w ∉ K_i} u_w.
  Emission rows of a distilled HMM are peaked (a state emits a few hundred tokens), so the mass
  outside the top K is small and the background keeps every token possible. The kept entries
  are rescaled so the row sums to 1 exactly. With a token ``support`` (e.g. the tokens the
  distilled LM sampled at least m times, :func:`support_from_tokens`) each row keeps its K
  largest entries *within the support*; a token outside it is then kept by no row, so its
  column is r · u_v / Σ u — one shared profile, which the guide multiplies as a single rank-1
  term (:mod:`ctrlg.guide.factored_emission`): the guide's product shrinks from V to the
  support's columns. Same tensors, same decoder.

Cost: O(h·V) to encode or decode; ``log8``/``normq8``: 1 byte per entry + 8 bytes per row (h = 512,
V = 49,152: 25.2 MB against 50.3 MB in bfloat16); ``topk8-K``: 3 bytes per kept entry (2 for the
index when V ≤ 65,536) + 12 bytes per row + 4·V bytes (h = 2,048, K = 4,096: 25.2 MB against 403 MB
in float32). ``docs/hmm.md`` compares their held-out log-likelihood.
"""

from __future__ import annotations

import torch

from ctrlg.errors import CheckpointError

__all__ = ["SCHEMES", "LOG_RANGE", "quantize_emission", "dequantize_emission", "topk_size",
           "support_from_tokens"]

SCHEMES = ("log8", "normq8", "topk8-K")
LOG_RANGE = 30.0
_LEVELS = 255


def topk_size(scheme: str) -> int | None:
    """K of a ``topk8-K`` scheme name; None for the dense schemes; CheckpointError otherwise
    (a scheme that is not one of these names, or not a string at all: ``5``, ``["log8"]``)."""
    if not isinstance(scheme, str):
        raise CheckpointError(f"emission quantization must be one of log8, normq8 or topk8-K "
                              f"(a string), got {scheme!r}")
    if scheme in ("log8", "normq8"):
        return None
    prefix, _, k = scheme.partition("-")
    if prefix == "topk8" and k.isdigit() and int(k) > 0:
        return int(k)
    raise CheckpointError(f"emission quantization must be one of log8, normq8 or topk8-K (K a "
                          f"positive integer, e.g. topk8-4096), got {scheme!r}")


def _log8(logs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row-wise linear 8-bit codes of log-probabilities ``logs`` [h, n] (module docstring)."""
    hi = logs.max(1).values
    lo = torch.maximum(logs.min(1).values, hi - LOG_RANGE)
    step = ((hi - lo) / _LEVELS).clamp_min(1e-12)
    codes = ((logs - lo[:, None]) / step[:, None]).round().clamp(0, _LEVELS)
    return codes.to(torch.uint8), lo.float(), step.float()


def _quantize_topk(B: torch.Tensor, k: int, support: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``topk8-K`` tensors of the float64 emission ``B`` [h, V], each row's K kept among the
    ``support`` tokens (bool [V]; None: all) (module docstring)."""
    h, V = B.shape
    if support is None:
        k = min(k, V)
        values, index = torch.topk(B, k, dim=1)
    else:
        within = support.nonzero()[:, 0]
        k = min(k, len(within))
        values, local = torch.topk(B[:, within], k, dim=1)
        index = within[local]
    codes, lo, step = _log8(values.clamp_min(torch.finfo(torch.float64).tiny).log())
    if V <= 65536:  # int16 holds 0..65535 as two's complement; decoded with `& 0xFFFF`
        index = (index - 65536 * (index >= 32768)).to(torch.int16)
    else:
        index = index.to(torch.int32)
    remainder = (1.0 - values.sum(1)).clamp_min(0.0)
    return {"emission_topk_index": index.contiguous(), "emission_codes": codes.contiguous(),
            "emission_lo": lo, "emission_step": step, "emission_rest": remainder.float(),
            "emission_background": B.mean(0).float()}


def _dequantize_topk(tensors: dict[str, torch.Tensor], scheme: str) -> torch.Tensor:
    """The float64 emission [h, V] of ``topk8-K`` tensors: the kept entries rescaled to 1 − r_i,
    the tail r_i spread in proportion to the background (module docstring)."""
    codes, lo, step = _row_codes(tensors, scheme,
                                 ("emission_topk_index", "emission_rest", "emission_background"))
    index = tensors["emission_topk_index"].long()
    if tensors["emission_topk_index"].dtype == torch.int16:
        index = index & 0xFFFF
    background = tensors["emission_background"].to(torch.float64).clamp_min(1e-300)
    h, V = index.shape[0], background.shape[0]
    kept = (lo + codes * step).exp()
    rest = tensors["emission_rest"].to(torch.float64).clamp(0.0, 1.0)
    kept = kept * ((1.0 - rest) / kept.sum(1)).clamp_min(0)[:, None]
    out = background.expand(h, V).clone()
    out.scatter_(1, index, 0.0)
    out = out * (rest / out.sum(1).clamp_min(1e-300))[:, None]
    out.scatter_(1, index, kept)
    return out / out.sum(1, keepdim=True)


def quantize_emission(emission: torch.Tensor, scheme: str,
                      support: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Codes (uint8 [h, V]) and per-row parameters (float32 [h]) of ``emission`` under
    ``scheme`` (``topk8-K``: the kept entries' indices and codes [h, K], the remaining mass and
    the background; with ``support``, bool [V], the kept entries only among those tokens);
    :func:`dequantize_emission` inverts it up to the rounding error (and, for ``topk8-K``, the
    flattening of each row's tail onto the background)."""
    k = topk_size(scheme)
    B = emission.detach().to("cpu", torch.float64)
    if support is not None:
        support = torch.as_tensor(support, dtype=torch.bool).cpu()
        if k is None:
            raise CheckpointError(f"an emission support needs a topk8-K scheme (the dense {scheme} "
                                  f"stores every token)")
        if support.shape != (B.shape[1],) or not bool(support.any()):
            raise CheckpointError(f"the emission support must be a non-empty bool vector over the "
                                  f"{B.shape[1]} tokens, got shape {tuple(support.shape)} with "
                                  f"{int(support.sum())} tokens")
    if k is not None:
        return _quantize_topk(B, k, support)
    if scheme == "log8":
        codes, lo, step = _log8(B.clamp_min(torch.finfo(torch.float64).tiny).log())
        return {"emission_codes": codes, "emission_lo": lo, "emission_step": step}
    top = B.max(1).values.clamp_min(torch.finfo(torch.float64).tiny)
    codes = (_LEVELS * B / top[:, None]).round().clamp(0, _LEVELS)
    return {"emission_codes": codes.to(torch.uint8), "emission_lo": torch.zeros_like(top).float(),
            "emission_step": (top / _LEVELS).float()}


def _row_codes(tensors: dict[str, torch.Tensor], scheme: str, extra: tuple[str, ...] = ()):
    """(codes, lo [h, 1], step [h, 1]) in float64, after checking that ``tensors`` hold them and
    ``extra``; CheckpointError naming the missing ones."""
    missing = {"emission_codes", "emission_lo", "emission_step", *extra} - tensors.keys()
    if missing:
        raise CheckpointError(f"a {scheme} checkpoint lacks tensors {sorted(missing)}")
    return (tensors["emission_codes"].to(torch.float64),
            tensors["emission_lo"].to(torch.float64)[:, None],
            tensors["emission_step"].to(torch.float64)[:, None])


def _check_stored(tensors: dict[str, torch.Tensor], scheme: str) -> None:
    """CheckpointError naming the tensor unless the stored tensors of ``scheme`` fit together:
    codes uint8 [h, n]; ``emission_lo`` / ``_step`` (and ``_rest``) finite float [h], the step
    positive; for
    ``topk8-K`` the indices int16 / int32 / int64 [h, n] naming tokens in [0, V) with no token
    twice in a row, and the background a finite non-negative float [V]."""
    codes = tensors["emission_codes"]
    if codes.dim() != 2 or codes.dtype != torch.uint8 or codes.shape[0] == 0 or codes.shape[1] == 0:
        raise CheckpointError(f"a {scheme} checkpoint's emission_codes must be uint8 [h, n], got "
                              f"{codes.dtype} {tuple(codes.shape)}")
    h = codes.shape[0]
    rows = ("emission_lo", "emission_step") + (("emission_rest",) if "emission_rest" in tensors
                                               else ())
    for name in rows:
        t = tensors[name]
        if t.shape != (h,) or not t.is_floating_point() or not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"a {scheme} checkpoint's {name} must be finite float [h={h}], "
                                  f"got {t.dtype} {tuple(t.shape)}")
    if not bool((tensors["emission_step"] > 0).all()):
        raise CheckpointError(f"a {scheme} checkpoint's emission_step must be positive (the "
                              f"quantiser never writes a step of 0 or less)")
    if topk_size(scheme) is None:
        return
    index, background = tensors["emission_topk_index"], tensors["emission_background"]
    if background.dim() != 1 or not background.is_floating_point() or \
            not bool(torch.isfinite(background).all()) or bool((background < 0).any()):
        raise CheckpointError(f"a {scheme} checkpoint's emission_background must be a finite "
                              f"non-negative float [V], got {background.dtype} "
                              f"{tuple(background.shape)}")
    V = background.shape[0]
    if index.shape != codes.shape or index.dtype not in (torch.int16, torch.int32, torch.int64):
        raise CheckpointError(f"a {scheme} checkpoint's emission_topk_index must be an int16 / "
                              f"int32 / int64 tensor of emission_codes' shape {tuple(codes.shape)}, "
                              f"got {index.dtype} {tuple(index.shape)}")
    tokens = index.long() & 0xFFFF if index.dtype == torch.int16 else index.long()
    if index.shape[1] > V or bool((tokens < 0).any()) or bool((tokens >= V).any()):
        raise CheckpointError(f"a {scheme} checkpoint's emission_topk_index names tokens outside "
                              f"[0, {V}) (or more than V per row)")
    ordered = tokens.sort(1).values
    if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
        raise CheckpointError(f"a {scheme} checkpoint's emission_topk_index keeps a token twice "
                              f"in one row")


def dequantize_emission(tensors: dict[str, torch.Tensor], scheme: str) -> torch.Tensor:
    """The float64 emission matrix [h, V] (rows sum to 1) decoded from :func:`quantize_emission`'s
    tensors; CheckpointError when the scheme is unknown or the tensors do not fit together
    (:func:`_check_stored`)."""
    if topk_size(scheme) is not None:
        _row_codes(tensors, scheme, ("emission_topk_index", "emission_rest", "emission_background"))
        _check_stored(tensors, scheme)
        return _dequantize_topk(tensors, scheme)
    codes, lo, step = _row_codes(tensors, scheme)
    _check_stored(tensors, scheme)
    if scheme == "log8":
        logs = lo + codes * step
        probs = (logs - logs.max(1, keepdim=True).values).exp()
    else:
        probs = codes.clamp_min(0.5) * step
    return probs / probs.sum(1, keepdim=True)


def support_from_tokens(tokens: torch.Tensor, vocab_size: int, min_count: int,
                        always: tuple[int, ...] = ()) -> torch.Tensor:
    """Bool [V]: the tokens that occur at least ``min_count`` times in ``tokens`` (any shape, e.g.
    the distillation's samples), plus ``always`` (e.g. EOS) — the ``support`` of
    :func:`quantize_emission`. A token the LM never wrote in the samples has no emission
    statistics of its own: EM left it at the prior's share."""
    if min_count < 1:
        raise CheckpointError(f"the support's min_count must be >= 1, got {min_count}")
    counts = torch.bincount(tokens.reshape(-1).long().cpu(), minlength=vocab_size)[:vocab_size]
    support = counts >= min_count
    support[list(always)] = True
    return support
