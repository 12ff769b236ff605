"""Memorisation that is verified offline, as ReLM's URL extraction (Kuchnik et al. 2023, §4.1,
Figures 5–6) measures it: shortest-path enumeration of a regex vs random sampling at fixed stop
lengths, counted in *verified* unique results per second and in duplicates.

ReLM checks each extracted URL over the network; here the strings are ones whose truth is
checked locally: runs of ``window`` consecutive terms of well-known integer sequences
(:func:`known_sequences`: naturals, even and odd numbers, squares, cubes, primes, Fibonacci and
Lucas numbers, triangular numbers, powers of 2, 3 and 10, factorials, Catalan numbers, multiples
of 5 and 10; every term below ``10**digits``), written ``"a, b, c, d, e"``. A candidate is
*verified* when it is such a window (:class:`Verifier`), so matching the query's regex
(``[0-9]{1,4}(, [0-9]{1,4}){4}``) is necessary, not sufficient: "1, 2, 4, 7, 11" matches and is
not verified.

* **shortest path** — :func:`ctrlg.relm.search` after the context, top-k decision rule: each
  result is one candidate (its text); results stream in probability order;
* **random sampling** — the LM's own top-k sampling after the same context for ``stop_length``
  tokens (ReLM's baseline: ``model.generate``, k = 40); every window of ``window`` consecutive
  comma-separated numbers in the sampled text is a candidate (:func:`number_windows`).

For each method: attempts, candidates, unique candidates, verified unique candidates, the
duplicate rate ``1 − unique / candidates``, wall and CPU seconds, verified unique per CPU second,
and the CPU time at which each new verified result appeared (the curve of ReLM's Figure 5). CPU
time (this process, all threads) is the measure of work: on a shared machine the wall time of
methods run one after the other measures the load of the moment as much as the method.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from ctrlg.relm.query import Query, search
from ctrlg.validation import check_context_length

__all__ = ["known_sequences", "Verifier", "number_windows", "run_shortest_path", "run_sampling"]

_RUN = re.compile(r"\d+(?:, \d+)*")


def _primes(limit: int) -> list[int]:
    sieve = bytearray([1]) * limit
    sieve[:2] = b"\x00\x00"
    for p in range(2, int(limit ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, limit, p)))
    return [i for i in range(limit) if sieve[i]]


def _recurrence(a: int, b: int, limit: int) -> list[int]:
    out = [a, b]
    while out[-1] + out[-2] < limit:
        out.append(out[-1] + out[-2])
    return out


def _while_below(terms: Iterable[int], limit: int) -> list[int]:
    out = []
    for t in terms:
        if t >= limit:
            break
        out.append(t)
    return out


def known_sequences(digits: int = 4) -> dict[str, list[int]]:
    """Well-known integer sequences (OEIS number in the name), every term below ``10**digits``,
    computed here from their definitions."""
    limit = 10 ** digits
    n = range(limit)
    catalan, c = [], 1
    for i in range(40):
        catalan.append(c)
        c = c * 2 * (2 * i + 1) // (i + 2)
    factorial, f = [], 1
    for i in range(1, 40):
        factorial.append(f)
        f *= i
    return {
        "naturals A001477": list(n),
        "even A005843": list(range(0, limit, 2)),
        "odd A005408": list(range(1, limit, 2)),
        "squares A000290": _while_below((i * i for i in n), limit),
        "cubes A000578": _while_below((i ** 3 for i in n), limit),
        "primes A000040": _primes(limit),
        "Fibonacci A000045": _recurrence(0, 1, limit),
        "Lucas A000032": _recurrence(2, 1, limit),
        "triangular A000217": _while_below((i * (i + 1) // 2 for i in n), limit),
        "powers of 2 A000079": _while_below((2 ** i for i in n), limit),
        "powers of 3 A000244": _while_below((3 ** i for i in n), limit),
        "powers of 10 A011557": _while_below((10 ** i for i in n), limit),
        "factorials A000142": _while_below(factorial, limit),
        "Catalan A000108": _while_below(catalan, limit),
        "multiples of 5 A008587": list(range(0, limit, 5)),
        "multiples of 10 A008592": list(range(0, limit, 10)),
    }


class Verifier:
    """The windows of ``window`` consecutive terms of :func:`known_sequences`, as their text
    ``"a, b, c"``; ``verify(text)`` names a sequence holding it (None: not verified)."""

    def __init__(self, window: int = 5, digits: int = 4):
        if window < 2:
            raise ValueError(f"window must be at least 2 terms, got {window}")
        self.window = window
        self.windows: dict[str, str] = {}
        for name, terms in known_sequences(digits).items():
            for i in range(len(terms) - window + 1):
                self.windows.setdefault(", ".join(map(str, terms[i:i + window])), name)

    def verify(self, text: str) -> str | None:
        return self.windows.get(text.strip())


def number_windows(text: str, window: int) -> list[str]:
    """Every run of ``window`` consecutive numbers written ``"a, b, …"`` in ``text`` (overlapping
    windows of longer runs included), as text."""
    out = []
    for run in _RUN.finditer(text):
        numbers = run.group(0).split(", ")
        out += [", ".join(numbers[i:i + window]) for i in range(len(numbers) - window + 1)]
    return out


@dataclass
class _Tally:
    """Candidates seen so far, and when each new verified one appeared."""

    verifier: Verifier
    start: float
    start_cpu: float
    candidates: int = 0

    def __post_init__(self):
        self.unique: dict[str, str | None] = {}
        self.curve: list[float] = []

    def add(self, texts: Sequence[str]) -> None:
        now = time.process_time() - self.start_cpu
        for text in texts:
            self.candidates += 1
            text = text.strip()
            if text not in self.unique:
                self.unique[text] = self.verifier.verify(text)
                if self.unique[text] is not None:
                    self.curve.append(now)

    def row(self, method: str, stop_length, attempts: int) -> dict:
        seconds = time.perf_counter() - self.start
        cpu = time.process_time() - self.start_cpu
        verified = [t for t, name in self.unique.items() if name is not None]
        by_sequence: dict[str, int] = {}
        for t in verified:
            by_sequence[self.unique[t]] = by_sequence.get(self.unique[t], 0) + 1
        return {"method": method, "stop_length": stop_length, "attempts": attempts,
                "candidates": self.candidates, "unique": len(self.unique),
                "verified": len(verified),
                "duplicate_rate": (1 - len(self.unique) / self.candidates
                                   if self.candidates else 0.0),
                "seconds": seconds, "cpu_seconds": cpu,
                "verified_per_cpu_second": len(verified) / cpu if cpu > 0 else 0.0,
                "curve": self.curve, "by_sequence": by_sequence,
                "examples": verified[:10]}


def run_shortest_path(model, tokenizer, context: Sequence[int], pattern: str,
                      verifier: Verifier, *, num_results: int, top_k: int | None = 40,
                      encodings: str = "canonical", max_tokens: int = 32, batch_size: int = 8,
                      max_expansions: int = 100_000) -> dict:
    """The first ``num_results`` matches of ``pattern`` after ``context`` in probability order,
    each a candidate."""
    query = Query(pattern=pattern, top_k=top_k, encodings=encodings, max_tokens=max_tokens)
    tally = _Tally(verifier, time.perf_counter(), time.process_time())
    attempts = 0
    for result in search(model, tokenizer, query, num_results=num_results, batch_size=batch_size,
                         context_ids=list(context), max_expansions=max_expansions):
        attempts += 1
        tally.add([result.text])
    return tally.row("shortest path", None, attempts)


@torch.no_grad()
def run_sampling(model, tokenizer, context: Sequence[int], verifier: Verifier, *,
                 stop_length: int, num_samples: int, top_k: int | None = 40,
                 batch_size: int = 8, seed: int = 0) -> dict:
    """``num_samples`` top-k samples of ``stop_length`` tokens after ``context``; every number
    window in a sample is a candidate."""
    check_context_length(model, len(context), int(stop_length), what="the context")
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    ids = torch.tensor([list(context)])
    tally = _Tally(verifier, time.perf_counter(), time.process_time())
    remaining = num_samples
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        while remaining > 0:
            rows = min(batch_size, remaining)
            remaining -= rows
            batch = ids.repeat(rows, 1)
            out = model.generate(batch, attention_mask=torch.ones_like(batch), do_sample=True,
                                 top_k=top_k or 0, top_p=1.0, temperature=1.0,
                                 max_new_tokens=int(stop_length), pad_token_id=pad)
            texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
            tally.add([w for text in texts for w in number_windows(text, verifier.window)])
    finally:
        torch.random.set_rng_state(generator_state)
    return tally.row("sampling", int(stop_length), num_samples)
