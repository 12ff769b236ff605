"""Baum-Welch (EM) for the HMM on fixed-length token sequences, in torch (CPU or CUDA).

E-step (scaled forward-backward, Rabiner 1989 §V.A), for a batch x [n, L] and E_t = B[:, x_t]::

    α̂_1 ∝ π ⊙ E_1,            α̂_t ∝ (α̂_{t-1} A) ⊙ E_t,          c_t = normaliser of α̂_t
    β̂_L = 1,                  β̂_t = A (E_{t+1} ⊙ β̂_{t+1}) / c_{t+1}
    γ_t = α̂_t ⊙ β̂_t,         Σ_t ξ_t = A ⊙ Σ_t α̂_tᵀ (E_{t+1} ⊙ β̂_{t+1} / c_{t+1})
    log p(x) = Σ_t log c_t

Expected counts: initial Σ γ_1, transition Σ_t ξ_t, emission scatter-add of γ_t into column x_t.

M-step with a pseudocount c (a Dirichlet prior; MAP-EM)::

    π ∝ N_π + c/h,   A_i· ∝ N_A,i· + c/h,   B_i· ∝ N_B,i· + c·u

where u is the prior's mean over the vocabulary: uniform (u_v = 1/V) or, with
``emission_prior="unigram"``, the add-one-smoothed unigram of the training tokens — so a state
that has not yet seen a token backs off to the token's overall frequency rather than to 1/V
(much better held-out likelihood when V ≫ tokens per state).

States listed in ``config["eos_pad_state"]`` keep their rows (emit EOS, stay; see lvd.py).

Mini-batch schedule (as Ctrl-G's training script): the training data is split into ``num_chunks``
equal chunks; ``schedule = [(steps, chunks), ...]`` runs, for each pair, ``steps`` EM steps each of
which takes the next ``chunks`` chunks (cycling through the data), computes their expected counts
and replaces the parameters by the M-step of those counts. Early steps on few chunks move fast;
the final pairs with ``chunks = num_chunks`` are full-batch EM, which never lowers the
(penalised) training log-likelihood. The held-out log-likelihood is recorded after every step.

``reduce`` (e.g. an all-reduce across processes, :mod:`ctrlg.hmm.distributed`) is applied to the
summed counts before each M-step, so several processes with disjoint data shards compute exactly
the single-process update.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError, VocabularyMismatchError
from ctrlg.hmm.model import HMM
from ctrlg.kernels.reference import ExpectedCounts, estep_torch

__all__ = ["ExpectedCounts", "estep_torch", "forward_loglik", "m_step", "expected_counts",
           "baum_welch", "EMHistory", "parse_schedule", "log_prior", "unigram_prior",
           "emission_prior_mean", "heldout_ll_per_token"]


def _check_tokens(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise CtrlgError(f"token batches must be [n, L] with L ≥ 1; got shape {tuple(tokens.shape)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise VocabularyMismatchError(f"token ids must lie in [0, {vocab_size}); got range "
                                      f"[{int(tokens.min())}, {int(tokens.max())}]")
    return tokens.long()


def forward_loglik(hmm: HMM, tokens: torch.Tensor, *, batch_size: int = 1024) -> torch.Tensor:
    """Total log p_hmm over the rows of ``tokens`` [N, L] (scaled forward, float64 sum)."""
    tokens = _check_tokens(tokens, hmm.vocab_size)
    total = torch.zeros((), dtype=torch.float64)
    for s in range(0, tokens.shape[0], batch_size):
        total += hmm.log_prob(tokens[s:s + batch_size].to(hmm.emission.device)).double().sum().cpu()
    return total


def _estep_fn(backend: str) -> Callable:
    if backend == "torch":
        return estep_torch
    if backend == "triton":
        from ctrlg.kernels.em_estep import estep_triton  # imports triton (heavy, optional)
        return estep_triton
    raise CtrlgError(f"unknown E-step backend {backend!r}; use 'torch' or 'triton'")


def expected_counts(hmm: HMM, tokens: torch.Tensor, *, batch_size: int = 256,
                    backend: str = "torch") -> ExpectedCounts:
    """Sum of the expected counts over the rows of ``tokens`` [N, L], in batches."""
    tokens = _check_tokens(tokens, hmm.vocab_size)
    fn = _estep_fn(backend)
    device = hmm.emission.device
    total = ExpectedCounts.zeros(hmm.hidden_size, hmm.vocab_size, device)
    for s in range(0, tokens.shape[0], batch_size):
        total.add_(fn(hmm.initial, hmm.transition, hmm.emission, tokens[s:s + batch_size].to(device)))
    return total


def _fixed_states(hmm: HMM) -> list[int]:
    state = hmm.config.get("eos_pad_state")
    return [] if state is None else [int(state)]


def unigram_prior(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Add-one-smoothed unigram distribution of ``tokens`` (float64 [V])."""
    counts = torch.bincount(torch.as_tensor(tokens).flatten().long().cpu(), minlength=vocab_size).double()
    return (counts + 1) / (counts.sum() + vocab_size)


def _emission_prior(prior: torch.Tensor | None, V: int) -> torch.Tensor | float:
    if prior is None:
        return 1.0 / V
    if prior.shape != (V,):
        raise CtrlgError(f"emission prior must have shape [{V}], got {tuple(prior.shape)}")
    return prior.double()


def m_step(hmm: HMM, counts: ExpectedCounts, *, pseudocount: float,
           emission_prior: torch.Tensor | None = None) -> HMM:
    """MAP M-step (module equation); rows of fixed states (EOS padding) are kept.
    ``emission_prior`` is the mean u [V] of the emission prior (None: uniform)."""
    if pseudocount < 0:
        raise CtrlgError(f"pseudocount must be ≥ 0, got {pseudocount}")
    h, V = hmm.hidden_size, hmm.vocab_size
    pi = counts.initial.double() + pseudocount / h
    A = counts.transition.double() + pseudocount / h
    u = _emission_prior(emission_prior, V)
    if isinstance(u, torch.Tensor):
        u = u.to(counts.emission.device)
    B = counts.emission.double() + pseudocount * u
    for s in _fixed_states(hmm):
        A[s] = hmm.transition[s].double()
        B[s] = hmm.emission[s].double()
    # rows that received no mass (state never visited, no pseudocount) keep their old values
    for new, old in ((A, hmm.transition), (B, hmm.emission)):
        dead = new.sum(-1) <= 0
        if dead.any():
            new[dead] = old[dead].double()
    if pi.sum() <= 0:
        pi = hmm.initial.double()
    pi, A, B = pi / pi.sum(), A / A.sum(-1, keepdim=True), B / B.sum(-1, keepdim=True)
    out = HMM(pi.float(), A.float(), B.float(), config=dict(hmm.config))
    return out


def log_prior(hmm: HMM, pseudocount: float, emission_prior: torch.Tensor | None = None) -> float:
    """log of the (unnormalised) Dirichlet prior the M-step maximises with the likelihood."""
    if pseudocount == 0:
        return 0.0
    h, V = hmm.hidden_size, hmm.vocab_size
    fixed = set(_fixed_states(hmm))
    free = [i for i in range(h) if i not in fixed]
    tiny = 1e-30
    total = pseudocount / h * hmm.initial.double().clamp_min(tiny).log().sum()
    total += pseudocount / h * hmm.transition[free].double().clamp_min(tiny).log().sum()
    u = _emission_prior(emission_prior, V)
    total += (pseudocount * u * hmm.emission[free].double().clamp_min(tiny).log()).sum()
    return float(total)


def parse_schedule(schedule) -> list[tuple[int, int]]:
    """``[(steps, chunks), ...]`` from a list of pairs or a string "10:1,5:4,5:16"."""
    if isinstance(schedule, str):
        try:
            pairs = [tuple(int(v) for v in item.split(":")) for item in schedule.split(",") if item.strip()]
        except ValueError:
            raise CtrlgError(f"EM schedule {schedule!r} must look like 'steps:chunks,steps:chunks'") from None
    else:
        pairs = [tuple(int(v) for v in item) for item in schedule]
    if not pairs or any(len(p) != 2 or p[0] < 0 or p[1] <= 0 for p in pairs):
        raise CtrlgError(f"EM schedule {schedule!r} must be non-empty (steps ≥ 0, chunks ≥ 1) pairs")
    return [(p[0], p[1]) for p in pairs]


@dataclass
class EMHistory:
    """Per-step record: ``train_ll`` is the mean log-likelihood per token of the step's chunks
    under the parameters *before* the step; ``heldout_ll`` is the held-out mean log-likelihood per
    token *after* it (index 0 = the initial model)."""
    step: list[int] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    train_ll: list[float] = field(default_factory=list)
    heldout_ll: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    tokens_per_second: list[float] = field(default_factory=list)
    best_step: int = 0  # the step whose parameters were returned
    stopped_early: bool = False  # the schedule was cut by baum_welch's time_limit

    def record(self, step: int, chunks: int, train_ll: float, heldout_ll: float, seconds: float,
               tokens_per_second: float) -> None:
        """Append one step's row."""
        self.step.append(step), self.chunks.append(chunks), self.train_ll.append(train_ll)
        self.heldout_ll.append(heldout_ll), self.seconds.append(seconds)
        self.tokens_per_second.append(tokens_per_second)

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


def heldout_ll_per_token(hmm: HMM, heldout_tokens: torch.Tensor | None) -> float:
    """Mean held-out log-likelihood per token (NaN without held-out tokens). O(N·L·h²)."""
    if heldout_tokens is None or heldout_tokens.numel() == 0:
        return float("nan")
    return float(forward_loglik(hmm, heldout_tokens) / heldout_tokens.numel())


def emission_prior_mean(name: str, train_tokens: torch.Tensor, vocab_size: int,
                         device) -> torch.Tensor | None:
    """The mean u of the emission prior (module docstring): None for "uniform", the
    add-one-smoothed unigram of ``train_tokens`` for "unigram". O(N·L + V)."""
    if name == "uniform":
        return None
    if name == "unigram":
        return unigram_prior(train_tokens, vocab_size).to(device)
    raise CtrlgError(f"emission_prior must be 'uniform' or 'unigram', got {name!r}")


def _shuffled_chunks(train_tokens: torch.Tensor, num_chunks: int, seed: int,
                     shard: tuple[int, int] | None) -> list[torch.Tensor]:
    """``num_chunks`` near-equal chunks of the rows of ``train_tokens`` after a shuffle seeded by
    ``seed`` (identical in every process); with ``shard=(rank, world)`` only rows
    ``rank::world`` of each chunk. O(N·L)."""
    order = torch.randperm(train_tokens.shape[0], generator=torch.Generator().manual_seed(int(seed)))
    chunks = [train_tokens[idx] for idx in torch.tensor_split(order, num_chunks)]
    if shard is not None:
        rank, world = shard
        if not 0 <= rank < world:
            raise CtrlgError(f"shard must be (rank, world_size) with 0 ≤ rank < world_size; got {shard}")
        chunks = [c[rank::world] for c in chunks]
    return chunks


def _chunk_windows(schedule: list[tuple[int, int]], num_chunks: int):
    """For every EM step of ``schedule``: the chunk indices it takes, the next
    ``min(chunks, num_chunks)`` chunks after the previous step's, cycling through the data."""
    cursor = 0
    for steps, per_step in schedule:
        per_step = min(per_step, num_chunks)
        for _ in range(steps):
            yield [(cursor + j) % num_chunks for j in range(per_step)]
            cursor = (cursor + per_step) % num_chunks


def _step_counts(hmm: HMM, batch: list[torch.Tensor], *, batch_size: int, backend: str,
                 reduce: Callable[[ExpectedCounts], None] | None) -> tuple[ExpectedCounts, float]:
    """E-step of one EM step: the expected counts of the ``batch`` chunks, reduced over processes
    by ``reduce``; returns (counts, seconds). O(tokens · h²)."""
    start = time.perf_counter()
    counts = expected_counts(hmm, torch.cat(batch), batch_size=batch_size, backend=backend)
    if reduce is not None:
        reduce(counts)
    dev = hmm.emission.device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return counts, time.perf_counter() - start


def baum_welch(hmm: HMM, train_tokens: torch.Tensor, *, schedule=((10, 1),), num_chunks: int = 1,
               pseudocount: float = 1.0, heldout_tokens: torch.Tensor | None = None,
               batch_size: int = 256, backend: str = "torch", device: str | torch.device | None = None,
               seed: int = 0, reduce: Callable[[ExpectedCounts], None] | None = None,
               shard: tuple[int, int] | None = None, emission_prior: str = "uniform",
               keep_best: bool = False, time_limit: float | None = None,
               progress: bool | None = None,
               callback: Callable[[int, HMM, EMHistory], None] | None = None) -> tuple[HMM, EMHistory]:
    """Run the mini-batch EM schedule (module docstring) from ``hmm``; returns the trained HMM and
    its :class:`EMHistory`. ``seed`` fixes the shuffle that forms the chunks.
    ``emission_prior`` is "uniform" or "unigram" (of all of ``train_tokens``; module docstring).
    ``keep_best`` returns the parameters with the best held-out log-likelihood seen (early
    stopping; the initial model included) instead of the last ones; ``history.best_step`` says
    which. ``time_limit`` (seconds) ends the schedule after the first step that finishes past it
    (a time box for a lease; ``history.stopped_early`` says whether it did).

    ``shard=(rank, world_size)`` keeps only rows ``rank::world_size`` of every chunk (the chunks
    themselves are formed from all of ``train_tokens``, identically in every process); with
    ``reduce`` summing the counts over processes, each step is the full single-process step."""
    schedule = parse_schedule(schedule)
    train_tokens = _check_tokens(train_tokens, hmm.vocab_size)
    if heldout_tokens is not None:
        heldout_tokens = _check_tokens(heldout_tokens, hmm.vocab_size)
    if num_chunks <= 0 or num_chunks > max(1, train_tokens.shape[0]):
        raise CtrlgError(f"num_chunks must be in [1, {train_tokens.shape[0]}] (number of training "
                         f"sequences); got {num_chunks}")
    if device is not None:
        hmm = hmm.to(device)
    prior = emission_prior_mean(emission_prior, train_tokens, hmm.vocab_size, hmm.emission.device)
    chunks = _shuffled_chunks(train_tokens, num_chunks, seed, shard)
    history = EMHistory()
    history.record(0, 0, float("nan"), heldout_ll_per_token(hmm, heldout_tokens), 0.0, float("nan"))
    best = (history.heldout_ll[0], 0, hmm)
    if progress is None:
        progress = sys.stderr.isatty()
    bar = tqdm(total=sum(s for s, _ in schedule), desc="EM", unit="step", disable=not progress)
    step = 0
    started = time.perf_counter()
    for window in _chunk_windows(schedule, num_chunks):
        if time_limit is not None and step > 0 and time.perf_counter() - started > float(time_limit):
            history.stopped_early = True
            break
        counts, elapsed = _step_counts(hmm, [chunks[j] for j in window], batch_size=batch_size,
                                       backend=backend, reduce=reduce)
        hmm = m_step(hmm, counts, pseudocount=pseudocount, emission_prior=prior)
        step += 1
        history.record(step, len(window), float(counts.loglik / counts.tokens.clamp_min(1)),
                       heldout_ll_per_token(hmm, heldout_tokens), elapsed,
                       float(counts.tokens) / max(elapsed, 1e-9))
        bar.update(1)
        bar.set_postfix(train=f"{history.train_ll[-1]:.3f}", heldout=f"{history.heldout_ll[-1]:.3f}")
        if history.heldout_ll[-1] > best[0]:
            best = (history.heldout_ll[-1], step, hmm)
        if callback is not None:
            callback(step, hmm, history)
    bar.close()
    if keep_best and heldout_tokens is not None and best[2] is not hmm:
        hmm, history.best_step = best[2], best[1]
    else:
        history.best_step = step
    return hmm, history
