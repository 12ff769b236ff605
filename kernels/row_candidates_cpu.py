"""Two passes over a beam search's [R, V] scores on the CPU, each one compiled loop that reads
every score once: the m largest entries per row, and every entry at or above a per-row floor.

They are the two [R, V] passes of the kept-entries lookahead (``ctrlg.guide.beam_candidates``):

* :func:`top_per_row` — for rows ``rows``, the ``m`` largest values of ``scores[row]`` with their
  columns, in decreasing order: what ``torch.topk(scores[rows], m)`` returns, up to the order of
  equal values. One pass per row in blocks of ``BLOCK`` columns: a block whose maximum does not
  beat the current m-th best is skipped after one vectorised max; otherwise its entries are
  inserted into the row's sorted top m (insertion sort, m is small).
* :func:`at_least_per_row` — for rows ``rows`` with floors ``floor``, every column v with
  ``scores[row, v] ≥ floor[i]`` (in increasing column order), and each row's count. What
  ``(scores[rows] >= floor[:, None]).nonzero()`` returns, without the [n, V] boolean, the
  per-row sum and the gather of the rows. A row with more than ``max_entries`` such columns is
  reported with its count and no entries (the caller computes it in full).

Both skip blocks by their maximum, so a row costs about one read of its V scores plus the work
on the few entries that pass. ``scores`` may hold −inf (never NaN: the loops assume ordered
comparisons). Without numba, the same results come from torch (:func:`compiled` says which).
"""

from __future__ import annotations

import numpy as np
import torch

from ctrlg.kernels.cpu_loops import compiled_loop, numpy_ready

__all__ = ["top_per_row", "at_least_per_row", "compiled", "BLOCK"]

#: Columns per block: one vectorised max decides whether a block can hold an entry.
BLOCK = 64


def _block_max_py(row, start, stop):
    """max(row[start:stop]) (one vectorised pass under numba's fastmath)."""
    best = row[start]
    for v in range(start + 1, stop):
        best = max(best, row[v])
    return best


_block_max = compiled_loop(_block_max_py, fastmath=True) or _block_max_py


def _top_per_row_py(scores, rows, m, out_values, out_index):
    V = scores.shape[1]
    for i in range(rows.shape[0]):
        row = scores[rows[i]]
        filled = 0                      # out_values[i, :filled] holds the best so far, decreasing
        start = 0
        while start < V:
            stop = min(V, start + BLOCK)
            block_max = _block_max(row, start, stop)
            if filled < m or block_max > out_values[i, m - 1]:
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
            start = stop


def _at_least_per_row_py(scores, rows, floor, max_entries, out_tokens, counts):
    V = scores.shape[1]
    for i in range(rows.shape[0]):
        row = scores[rows[i]]
        bar = floor[i]
        n = 0
        start = 0
        while start < V:
            stop = min(V, start + BLOCK)
            block_max = _block_max(row, start, stop)
            if block_max >= bar:
                for v in range(start, stop):
                    if row[v] >= bar:
                        if n < max_entries:
                            out_tokens[i, n] = v
                        n += 1
            start = stop
        counts[i] = n


_top_per_row = compiled_loop(_top_per_row_py, fastmath=True)
_at_least_per_row = compiled_loop(_at_least_per_row_py, fastmath=True)


def compiled() -> bool:
    """Whether the compiled loops are available (numba); else torch computes the same."""
    return _top_per_row is not None


def _cpu_rows(scores: torch.Tensor, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(float32 numpy view of ``scores``, int64 rows) when the compiled loops apply, else None."""
    if not numpy_ready(scores):
        return None
    return scores.numpy(), np.ascontiguousarray(rows, dtype=np.int64)


def top_per_row(scores: torch.Tensor, rows: np.ndarray, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float32 [n, m] decreasing, columns int64 [n, m]) of the ``m`` ≤ V largest entries
    of each of ``scores``' rows ``rows`` (module docstring)."""
    m = int(m)
    native = _cpu_rows(scores, rows)
    if native is None:
        return torch.topk(scores[torch.as_tensor(rows, device=scores.device)], m)
    values = np.empty((len(rows), m), dtype=np.float32)
    index = np.empty((len(rows), m), dtype=np.int64)
    if len(rows):
        _top_per_row(native[0], native[1], m, values, index)
    return torch.from_numpy(values), torch.from_numpy(index)


def at_least_per_row(scores: torch.Tensor, rows: np.ndarray, floor: np.ndarray,
                     max_entries: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions in ``rows``, columns, counts [n]): every entry of row ``rows[i]`` of ``scores``
    at or above ``floor[i]`` (float32 comparison), rows in order and columns increasing within a
    row, leaving out the rows with more than ``max_entries`` (their count is still reported)."""
    floor32 = np.asarray(floor, dtype=np.float32)
    native = _cpu_rows(scores, rows)
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
        _at_least_per_row(native[0], native[1], floor32, int(max_entries), tokens, counts)
    listed = np.where(counts <= max_entries, counts, 0)
    position = np.repeat(np.arange(n), listed)
    columns = tokens[position, np.arange(len(position)) - np.repeat(np.cumsum(listed) - listed, listed)]
    return position, columns, counts
