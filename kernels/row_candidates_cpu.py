"""Two passes over a beam search's [R, V] scores on the CPU: the m largest entries per row, and
every entry at or above a per-row floor, each a compiled loop that reads only the blocks of
``BLOCK`` columns that can hold an entry.

They are the two [R, V] passes of the kept-entries lookahead (``ctrlg.guide.beam_candidates``):

* :func:`block_maxima` — each row's maximum per block of ``BLOCK`` columns, [R, ⌈V / BLOCK⌉]:
  one vectorised streaming pass (torch's ``amax``), the only pass that reads every score. The
  two passes below take it (``block_max=``; computed when not given) and share it within a step.
* :func:`top_per_row` — for rows ``rows``, the ``m`` largest values of ``scores[row]`` with their
  columns, in decreasing order: what ``torch.topk(scores[rows], m)`` returns, up to the order of
  equal values. Blocks in column order: a block whose maximum does not beat the current m-th
  best is skipped without reading it; otherwise its entries are inserted into the row's sorted
  top m (insertion sort, m is small).
* :func:`at_least_per_row` — for rows ``rows`` with floors ``floor``, every column v with
  ``scores[row, v] ≥ floor[i]`` (in increasing column order), and each row's count. What
  ``(scores[rows] >= floor[:, None]).nonzero()`` returns, without the [n, V] boolean, the
  per-row sum and the gather of the rows; blocks whose maximum is below the floor are not read.
  A row with more than ``max_entries`` such columns is reported with its count and no entries
  (the caller computes it in full).

Cost per row: one streaming read of its V scores for the block maxima (about 1 ms for 128 rows
of 49,152 on one core, against 4-5 ms when each block's maximum was a scalar loop inside the
selection), then V / BLOCK comparisons and the work on the few blocks that pass. ``scores`` may
hold −inf (never NaN: the loops assume ordered comparisons). Without numba, the same results come
from torch (:func:`compiled` says which).
"""

from __future__ import annotations

import numpy as np
import torch

from ctrlg.kernels.cpu_loops import compiled_loop, numpy_ready

__all__ = ["block_maxima", "top_per_row", "at_least_per_row", "compiled", "BLOCK"]

#: Columns per block: one vectorised max decides whether a block can hold an entry.
BLOCK = 64


def _top_per_row_py(scores, block_max, rows, m, out_values, out_index):
    V = scores.shape[1]
    for i in range(rows.shape[0]):
        row = scores[rows[i]]
        maxima = block_max[rows[i]]
        filled = 0                      # out_values[i, :filled] holds the best so far, decreasing
        for b in range(maxima.shape[0]):
            start = b * BLOCK
            stop = min(V, start + BLOCK)
            if filled < m or maxima[b] > out_values[i, m - 1]:
                for v in range(start, stop):
                    value = row[v]
                    if filled < m or value > out_values[i, m - 1]:
                        k = filled if filled < m else m - 1      # insertion sort into the top m
                        while k > 0 and out_values[i, k - 1] < value:
                            out_values[i, k] = out_values[i, k - 1]
                            out_index[i, k] = out_index[i, k - 1]
                            k -= 1
                        out_values[i, k] = value
                        out_index[i, k] = v
                        filled = min(filled + 1, m)


def _at_least_per_row_py(scores, block_max, rows, floor, max_entries, out_tokens, counts):
    V = scores.shape[1]
    for i in range(rows.shape[0]):
        row = scores[rows[i]]
        maxima = block_max[rows[i]]
        bar = floor[i]
        n = 0
        for b in range(maxima.shape[0]):
            start = b * BLOCK
            stop = min(V, start + BLOCK)
            if maxima[b] >= bar:
                for v in range(start, stop):
                    if row[v] >= bar:
                        if n < max_entries:
                            out_tokens[i, n] = v
                        n += 1
        counts[i] = n


_top_per_row = compiled_loop(_top_per_row_py, fastmath=True)
_at_least_per_row = compiled_loop(_at_least_per_row_py, fastmath=True)


def compiled() -> bool:
    """Whether the compiled loops are available (numba); else torch computes the same."""
    return _top_per_row is not None


def block_maxima(scores: torch.Tensor) -> np.ndarray:
    """float32 [R, ⌈V / BLOCK⌉]: each row's maximum over columns [b·BLOCK, (b + 1)·BLOCK) of the
    float32 [R, V] CPU tensor ``scores`` (a last, shorter block where BLOCK does not divide V)."""
    R, V = scores.shape
    full = V // BLOCK
    out = np.empty((R, -(-V // BLOCK)), dtype=np.float32)
    if full:
        out[:, :full] = scores[:, :full * BLOCK].reshape(R, full, BLOCK).amax(-1).numpy()
    if V % BLOCK:
        out[:, full] = scores[:, full * BLOCK:].amax(-1).numpy()
    return out


def _cpu_rows(scores: torch.Tensor, rows: np.ndarray, block_max: np.ndarray | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(float32 numpy view of ``scores``, its block maxima, int64 rows) when the compiled loops
    apply, else None."""
    if not numpy_ready(scores):
        return None
    if block_max is None:
        block_max = block_maxima(scores)
    else:
        expected = (scores.shape[0], -(-scores.shape[1] // BLOCK))
        if block_max.shape != expected:
            raise ValueError(f"block_max has shape {block_max.shape}, expected {expected} for "
                             f"scores {tuple(scores.shape)}")
    return scores.numpy(), block_max, np.ascontiguousarray(rows, dtype=np.int64)


def top_per_row(scores: torch.Tensor, rows: np.ndarray, m: int, block_max: np.ndarray | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float32 [n, m] decreasing, columns int64 [n, m]) of the ``m`` ≤ V largest entries
    of each of ``scores``' rows ``rows`` (module docstring). ``block_max``: :func:`block_maxima`
    of ``scores`` when already at hand."""
    m = int(m)
    native = _cpu_rows(scores, rows, block_max)
    if native is None:
        return torch.topk(scores[torch.as_tensor(rows, device=scores.device)], m)
    values = np.empty((len(rows), m), dtype=np.float32)
    index = np.empty((len(rows), m), dtype=np.int64)
    if len(rows):
        _top_per_row(*native, m, values, index)
    return torch.from_numpy(values), torch.from_numpy(index)


def at_least_per_row(scores: torch.Tensor, rows: np.ndarray, floor: np.ndarray,
                     max_entries: int, block_max: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions in ``rows``, columns, counts [n]): every entry of row ``rows[i]`` of ``scores``
    at or above ``floor[i]`` (float32 comparison), rows in order and columns increasing within a
    row, leaving out the rows with more than ``max_entries`` (their count is still reported).
    ``block_max``: :func:`block_maxima` of ``scores`` when already at hand."""
    floor32 = np.asarray(floor, dtype=np.float32)
    native = _cpu_rows(scores, rows, block_max)
    if native is None:
        rows_t = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=scores.device)
        hit = scores[rows_t] >= torch.as_tensor(floor32, device=scores.device)[:, None]
        r, v = (x.cpu().numpy() for x in hit.nonzero(as_tuple=True))
        counts = np.bincount(r, minlength=len(rows))
        keep = counts[r] <= max_entries
        return r[keep], v[keep], counts
    n = len(rows)
    width = max(1, min(int(max_entries), scores.shape[1]))
    tokens = np.empty((n, width), dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    if n:
        _at_least_per_row(*native, floor32, int(max_entries), tokens, counts)
    listed = np.where(counts <= max_entries, counts, 0)
    position = np.repeat(np.arange(n), listed)
    columns = tokens[position, np.arange(len(position)) - np.repeat(np.cumsum(listed) - listed, listed)]
    return position, columns, counts
