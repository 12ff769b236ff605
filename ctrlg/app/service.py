"""The editor's generation service: one request → constraint → guided sampling → ranked candidates.

A request asks for the text y that goes between a ``prefix`` and a ``suffix`` (an empty suffix is
a continuation). The service

1. tokenises the LM's ``prompt_header`` (the continuation LM's BOS and instruction,
   :func:`ctrlg.data.story_prompts.continuation_prompt`) and the last tokens of the prefix, at
   most ``prompt_tokens`` in all, as the LM prompt and the first
   ``suffix_tokens`` tokens of the suffix as the insertion suffix σ (Ctrl-G §5: the HMM's tables
   require σ to follow y; candidates are reranked by log p_lm(y ⊕ σ | prompt)). Logical masking
   has no model of what follows, so there σ only enters the reranking;
2. builds the request's token DFA (:mod:`ctrlg.dfa.edit_constraint`), memoised per constraint;
3. calls :func:`ctrlg.generate`, which builds a **fresh** ConstraintLogitsProcessor, so row states
   never mix between requests, and returns the accepted samples;
4. trims each sample's tail of symbol-only tokens (spaces, ``#``, quotes ...; the tail's first
   sentence-final punctuation is kept) as long as the shorter text is still accepted by the DFA
   (a word budget spent before the token budget leaves such a tail, since the LM rarely ends raw
   text with EOS), drops duplicates and empty texts, and ranks them by log p_lm(y ⊕ σ | prompt).
   Cost: the LM's decoding steps for ``num_candidates`` samples plus one scoring pass; the
   prompt is encoded once for both, and not again by the next requests with the same prompt
   (:class:`ctrlg.lm.shared_context.ContextCache`, the last ``Limits.contexts_kept`` prompts).

Concurrency: one model call at a time (a lock); at most ``max_queue`` requests wait for it, the
next one gets :class:`ServerBusyError`. Every request has a deadline (``time_budget_s`` from its
arrival, queueing included) and a cancel flag; both are checked while queued and after every
generated token (a transformers ``StoppingCriteria``), so a cancelled or late request frees the
model within one decoding step. Unfinished samples are dropped: a stopped request returns the
samples that had already ended, or an error when none had.

Whitespace. BPE vocabularies attach the space to the next word, so a prefix's trailing spaces are
removed from the prompt (and one leading space from each candidate), and a suffix that starts
with a letter or digit is given a leading space for the model (and each candidate a trailing
space): a candidate's ``text`` is exactly what goes between ``prefix`` and ``suffix``.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ctrlg.app.compute import ComputeThread, shared_compute_thread
from ctrlg.dfa.edit_constraint import EditConstraint, build_constraint
from ctrlg.errors import CtrlgError, UnsatisfiableConstraintError
from ctrlg.lm.shared_context import ContextCache
from ctrlg.memory import check_lm_fits
from ctrlg.sampler import generate as guided_generate
from ctrlg.sampler import lm_log_likelihood
from ctrlg.validation import check_context_length
from ctrlg.vocab import eos_token_ids, lm_vocab_size, token_bytes

__all__ = ["Limits", "EditorService", "Job", "EditorError", "ConstraintTooLargeError",
           "ServerBusyError", "RequestCancelledError", "TimeBudgetError", "UnknownRequestError"]


_WORD = re.compile(rb"[0-9A-Za-z\x80-\xff]")     # a letter or digit (as in ctrlg.dfa.words)
_SENTENCE_END = re.compile(rb"[.!?]")


class EditorError(CtrlgError):
    """A request the editor cannot serve; ``status`` is its HTTP status code."""

    status = 422


class ConstraintTooLargeError(EditorError):
    """The constraint's guide tables would exceed the memory budget."""


class ServerBusyError(EditorError):
    """Too many requests are already waiting for the model."""

    status = 429


class RequestCancelledError(EditorError):
    """The request was cancelled by its client."""

    status = 409


class TimeBudgetError(EditorError):
    """The request ran out of its time budget before any candidate was complete."""

    status = 408


class UnknownRequestError(EditorError):
    """No request with this id is known."""

    status = 404


@dataclass
class Limits:
    """Run-time knobs of the service (the request schema bounds the sizes of inputs)."""

    time_budget_s: float = 120.0     # per request, from arrival (queueing included)
    prompt_tokens: int = 512         # the LM sees at most this many prefix tokens (the last ones)
    suffix_tokens: int = 32          # the HMM and reranker see at most this many suffix tokens
    max_table_mb: float = 512.0      # guide tables: states × (n + 1) × h × 4 bytes
    max_queue: int = 8               # requests building their constraint or waiting for the model
    max_jobs_kept: int = 64          # finished jobs kept for progress queries
    max_constraint_states: int = 200_000   # the most states a step of the constraint's product may reach
    contexts_kept: int = 2           # prompts whose encoding is kept for the next requests


@dataclass
class Job:
    """Progress and cancellation of one request (shared between the request and progress polls)."""

    id: str
    budget_s: float
    max_new_tokens: int
    state: str = "queued"            # queued → building → generating → done | cancelled | failed
    tokens: int = 0                  # tokens generated so far (per sample)
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.deadline = time.monotonic() + self.budget_s

    def stop_reason(self) -> str | None:
        if self.cancel_event.is_set():
            return "cancelled"
        if time.monotonic() > self.deadline:
            return "time budget exceeded"
        return None

    def as_dict(self) -> dict:
        return {"request_id": self.id, "state": self.state, "tokens": self.tokens,
                "max_new_tokens": self.max_new_tokens}


class _JobStopper(StoppingCriteria):
    """Records the decoding step in the job and stops generation when it is cancelled or late."""

    def __init__(self, job: Job, prompt_length: int):
        self.job, self.prompt_length = job, prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.job.tokens = int(input_ids.shape[1]) - self.prompt_length
        stop = self.job.stop_reason() is not None
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class EditorService:
    """Serves generation requests on one LM / tokenizer / HMM (``hmm=None``: logical mode only)."""

    def __init__(self, model, tokenizer, hmm=None, *, limits: Limits | None = None,
                 model_name: str = "custom", prompt_header: str = "",
                 compute: ComputeThread | None = None):
        self.model, self.tokenizer, self.hmm = model, tokenizer, hmm
        # the thread every model call runs on (ctrlg.app.compute: one OpenMP pool, not one per
        # request thread); pass the one that loaded the model, else the process's shared one
        self.compute = compute or shared_compute_thread()
        # what the LM reads before the writer's text: the continuation LM's BOS + instruction
        # (ctrlg.data.story_prompts.continuation_prompt); "" for a plain LM
        self.prompt_header = prompt_header
        self._header_ids = list(tokenizer(prompt_header, add_special_tokens=False).input_ids) \
            if prompt_header else []
        self.limits = limits or Limits()
        self.model_name = model_name
        self.vocab_size = lm_vocab_size(model)
        self.eos_id = next(iter(eos_token_ids(tokenizer, model)), None)   # the first EOS ends y
        self._token_bytes = token_bytes(tokenizer)
        self._model_lock = threading.Lock()
        self._memo_lock = threading.Lock()
        self._jobs_lock = threading.Lock()
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._waiting = 0
        self._constraints: OrderedDict[tuple, object] = OrderedDict()
        # the prompt's key/value cache, shared by sampling and the rerank of a request and kept
        # for the next requests at the same place (used under the model lock only)
        self._contexts = ContextCache(capacity=self.limits.contexts_kept)

    # ------------------------------------------------------------------ jobs
    def open_job(self, request_id: str | None, max_new_tokens: int) -> Job:
        job = Job(request_id or uuid.uuid4().hex, self.limits.time_budget_s, max_new_tokens)
        with self._jobs_lock:
            old = self._jobs.get(job.id)
            if old is not None and old.state in ("queued", "building", "generating"):
                raise EditorError(f"request_id {job.id!r} is already running; use a new id")
            self._jobs[job.id] = job
            self._jobs.move_to_end(job.id)
            finished = [key for key, kept in self._jobs.items()
                        if kept.state not in ("queued", "building", "generating")]
            for key in finished[:max(0, len(self._jobs) - self.limits.max_jobs_kept)]:
                del self._jobs[key]          # oldest finished first; a running job is never dropped
        return job

    def job(self, request_id: str) -> Job:
        with self._jobs_lock:
            job = self._jobs.get(request_id)
        if job is None:
            raise UnknownRequestError(f"no request with id {request_id!r}")
        return job

    def cancel(self, request_id: str) -> bool:
        """Flag the request; returns whether it was still queued or running."""
        job = self.job(request_id)
        job.cancel_event.set()
        return job.state in ("queued", "building", "generating")

    def forget_prompts(self) -> None:
        """Drop the kept prompt encodings (the next request encodes its prompt again)."""
        with self._model_lock:
            self._contexts.clear()

    def status(self) -> dict:
        return {"busy": self._model_lock.locked(), "queued": self._waiting}

    # ------------------------------------------------------------------ text ↔ tokens
    def _encode(self, prefix: str, suffix: str) -> tuple[list[int], list[int] | None, bool, bool]:
        """(prompt ids, suffix ids or None, drop a leading space, add a trailing space)."""
        tok = self.tokenizer
        prompt_text = prefix.rstrip(" \t")
        drop_space = len(prompt_text) < len(prefix)
        prompt_ids = list(tok(prompt_text, add_special_tokens=False).input_ids) if prompt_text else []
        prompt_ids = self._header_ids + prompt_ids[-max(1, self.limits.prompt_tokens - len(self._header_ids)):]
        if not prompt_ids:
            start = tok.bos_token_id if tok.bos_token_id is not None else self.eos_id
            if start is None:
                raise EditorError("the prefix is empty and the tokenizer has neither a BOS nor an "
                                  "EOS token to start from; give some text before the cursor")
            prompt_ids = [int(start)]
        add_space = bool(suffix) and suffix[0].isalnum()
        suffix_ids = None
        if suffix.strip():
            model_suffix = (" " + suffix) if add_space else suffix
            suffix_ids = list(tok(model_suffix, add_special_tokens=False).input_ids)
            suffix_ids = suffix_ids[:self.limits.suffix_tokens] or None
        return prompt_ids, suffix_ids, drop_space, add_space

    def _trim(self, ids: list[int], constraint) -> list[int]:
        """The generation without EOS and without its tail of tokens that hold no letter or digit,
        up to and including the first sentence-final punctuation of that tail; tokens are dropped
        only while the shorter sequence (ended by EOS) is still accepted by ``constraint``. A word
        budget spent before the token budget otherwise leaves a tail of spaces and symbols (the
        LM rarely ends raw text with EOS)."""
        data = self._token_bytes
        text_of = lambda t: data[t] if t < len(data) else b""  # noqa: E731
        end = [] if self.eos_id is None else [self.eos_id]
        body = list(ids[:-1]) if ids and ids[-1] == self.eos_id else list(ids)
        keep = len(body)
        while keep and not _WORD.search(text_of(body[keep - 1])) \
                and constraint.accepts(body[:keep - 1] + end):
            keep -= 1
        for j in range(keep, len(body)):
            if _SENTENCE_END.search(text_of(body[j])):
                if constraint.accepts(body[:j + 1] + end):
                    keep = j + 1
                break
        return body[:keep]

    def _decode(self, body: list[int], drop_space: bool, add_space: bool) -> str:
        text = self.tokenizer.decode(body, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)
        if drop_space and text.startswith(" "):
            text = text[1:]
        if add_space and text and not text[-1].isspace():
            text += " "
        return text

    # ------------------------------------------------------------------ constraint
    def constraint(self, spec: EditConstraint, job: Job | None = None):
        """The request's DFA (memoised: the last 16 constraints). Built outside the model lock;
        the job's deadline and cancel flag are checked between its parts
        (:func:`ctrlg.dfa.edit_constraint.build_constraint`)."""
        with self._memo_lock:
            if spec in self._constraints:
                self._constraints.move_to_end(spec)
                return self._constraints[spec]
        check = None if job is None else (lambda: self._raise_if_stopped(job, "while building its constraint"))
        built = build_constraint(self.tokenizer, spec, self.vocab_size,
                                 [] if self.eos_id is None else [self.eos_id], check=check,
                                 max_states=self.limits.max_constraint_states)
        with self._memo_lock:
            self._constraints[spec] = built
            while len(self._constraints) > 16:
                self._constraints.popitem(last=False)
        return built

    def _check_table_size(self, constraint, max_new_tokens: int, mode: str) -> None:
        h = self.hmm.hidden_size if mode == "ctrlg" else 0
        megabytes = constraint.num_states * (max_new_tokens + 1) * (4 * h + 1) / 2**20
        if megabytes > self.limits.max_table_mb:
            raise ConstraintTooLargeError(
                f"the constraint has {constraint.num_states} DFA states; with max_new_tokens="
                f"{max_new_tokens} its guide tables would take {megabytes:.0f} MB (limit "
                f"{self.limits.max_table_mb:.0f} MB): use fewer keyphrases or banned words, a "
                "narrower word range or fewer new tokens")

    @staticmethod
    def _sample(*args, **kwargs):
        try:
            return guided_generate(*args, **kwargs)
        except UnsatisfiableConstraintError:
            raise EditorError(
                f"the constraint cannot be met within max_new_tokens={kwargs['max_new_tokens']} "
                "tokens: allow more tokens, or ask for fewer words or keyphrases") from None

    # ------------------------------------------------------------------ the model call
    def _reserve(self, job: Job) -> None:
        """A place among the ``max_queue`` requests that build their constraint or wait for the
        model; ServerBusyError (429) when none is free. Released by :meth:`_acquire` (or on
        failure, :meth:`_release_slot`)."""
        with self._jobs_lock:
            if self._waiting >= self.limits.max_queue:
                job.state = "failed"
                raise ServerBusyError(f"{self._waiting} requests are already waiting for the "
                                      "model; try again later")
            self._waiting += 1

    def _release_slot(self) -> None:
        with self._jobs_lock:
            self._waiting -= 1

    def _acquire(self, job: Job) -> None:
        """The model lock, waited for with the job's deadline and cancel flag checked; frees the
        job's queue place either way."""
        try:
            while not self._model_lock.acquire(timeout=0.05):
                self._raise_if_stopped(job, "while queued")
        finally:
            self._release_slot()

    @staticmethod
    def _raise_if_stopped(job: Job, when: str) -> None:
        reason = job.stop_reason()
        if reason == "cancelled":
            job.state = "cancelled"
            raise RequestCancelledError(f"request {job.id!r} was cancelled {when}")
        if reason is not None:
            job.state = "failed"
            raise TimeBudgetError(f"request {job.id!r} ran out of its time budget "
                                  f"({job.budget_s:g} s) {when}; ask for fewer candidates or "
                                  "tokens")

    def _model_call(self, request, job: Job, constraint, prompt_ids: list[int],
                    suffix_ids: list[int] | None):
        """Sample the candidates and score them (on the compute thread, under the model lock):
        (samples, distinct non-empty bodies, their LM log-likelihoods with the suffix)."""
        stopper = _JobStopper(job, len(prompt_ids))
        results = self._sample(
            self.model, self.tokenizer, prompt_ids, constraint,
            hmm=self.hmm if request.mode == "ctrlg" else None, mode=request.mode,
            max_new_tokens=request.max_new_tokens, num_samples=request.num_candidates,
            seed=request.seed, rank_by_lm=False,
            suffix=suffix_ids if request.mode == "ctrlg" else None,
            eos_token_id=[] if self.eos_id is None else [self.eos_id],
            stopping_criteria=StoppingCriteriaList([stopper]), contexts=self._contexts)
        bodies = [b for b in dict.fromkeys(tuple(self._trim(g.token_ids, constraint))
                                           for g in results) if b]   # distinct, non-empty
        scores = lm_log_likelihood(self.model, prompt_ids,
                                   [list(b) + (suffix_ids or []) for b in bodies],
                                   contexts=self._contexts)
        return results, bodies, scores

    def generate(self, request, job: Job) -> dict:
        """Serve one request (a :class:`ctrlg.app.schemas.GenerateRequest`); blocks for the model.

        Returns ``{"candidates": [{"text", "log_likelihood"}], "seconds"}``, best first."""
        start = time.perf_counter()
        try:
            if request.mode == "ctrlg" and self.hmm is None:
                raise EditorError("mode 'ctrlg' needs an HMM but the server runs without one; "
                                  "use mode 'logical' or start the server with --hmm")
            spec = EditConstraint.from_lists(request.keyphrases, request.banned,
                                             request.min_words, request.max_words,
                                             request.allow_newlines)
            prompt_ids, suffix_ids, drop_space, add_space = self._encode(request.prefix,
                                                                         request.suffix)
            check_context_length(self.model, len(prompt_ids), request.max_new_tokens,
                                 suffix_tokens=len(suffix_ids or []), what="the prefix")
            check_lm_fits(self.model, rows=request.num_candidates, prompt_length=len(prompt_ids),
                          max_new_tokens=request.max_new_tokens,
                          vocab_size=self.vocab_size,
                          scored_rows=request.num_candidates,
                          suffix_length=len(suffix_ids or []),
                          what=f"this request (num_candidates={request.num_candidates}, "
                               f"max_new_tokens={request.max_new_tokens}, a "
                               f"{len(prompt_ids)}-token prompt)",
                          advice="ask for fewer candidates or tokens, or try again later")
            self._reserve(job)
            try:
                job.state = "building"
                try:
                    constraint = self.constraint(spec, job)
                except UnsatisfiableConstraintError as err:
                    raise EditorError(f"no text satisfies these constraints together ({spec.describe()}):"
                                      f" {err}") from None
                self._check_table_size(constraint, request.max_new_tokens, request.mode)
            except BaseException:
                self._release_slot()
                raise
            job.state = "queued"
            self._acquire(job)
            try:
                self._raise_if_stopped(job, "while queued")
                job.state = "generating"
                results, bodies, scores = self.compute.run(
                    self._model_call, request, job, constraint, prompt_ids, suffix_ids)
            finally:
                self._model_lock.release()
            if job.stop_reason() is not None and not results:
                self._raise_if_stopped(job, "during generation")
        except BaseException:
            if job.state not in ("cancelled", "failed"):
                job.state = "failed"
            raise
        job.state = "done"
        ranked = sorted(zip(scores, bodies), key=lambda pair: -pair[0])
        candidates = [{"text": self._decode(list(body), drop_space, add_space),
                       "log_likelihood": score if math.isfinite(score) else None}
                      for score, body in ranked]
        return {"candidates": candidates, "seconds": round(time.perf_counter() - start, 3),
                "request_id": job.id}
