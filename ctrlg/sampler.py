"""Ctrl-G decoding with transformers: a LogitsProcessor, a ``generate`` helper and LM reranking.

:class:`ConstraintLogitsProcessor` implements Ctrl-G's rule (Zhang et al. 2024, eq. 2)

    p(v | x≤t, α) ∝ p_lm(v | x≤t) · p_hmm(α | x≤t, v),
    p_hmm(α | x≤t, v) = P_hmm(v, α | x≤t) / P_hmm(v | x≤t)            (see :mod:`ctrlg.guide`)

as ``log_softmax(scores + log p_hmm(α | x≤t, v))`` per row, so the returned scores are normalised
log-probabilities of the guided distribution (for beam search, beam scores are then sums of guided
log-probabilities; for sampling the normalisation is immaterial). Tokens that make the constraint
unsatisfiable within the remaining budget get exactly −inf.

Order with transformers' warpers (5.x, ``GenerationMixin._get_logits_processor``): built-in
processors (min-length, repetition penalty, ...) run first, then user ``logits_processor`` entries
(this one), then — only when ``do_sample=True`` — temperature, top-k, top-p, min-p, ... So guidance
is applied before temperature/top-k/top-p, and since warpers only rescale or set entries to −inf,
infeasible tokens stay at −inf.

Row state. transformers passes the whole ``input_ids`` each call; rows may be reordered or
duplicated (beam search, ``num_return_sequences``). The processor keeps a dict from
``(dfa index, generated-token tuple)`` to ``(DFA state, HMM prior)`` for the previous length, so each
row finds its parent exactly, whatever the reordering. Row i uses DFA ``i // (B / len(dfas))``
(transformers expands each input row into consecutive beams/samples). Rows that already emitted EOS
(finished samples padded by transformers) are passed through unchanged.

Vocabularies. The DFA and HMM have V tokens; ``scores`` may be wider (LMs often pad their output
layer): the extra columns are set to −inf. Narrower scores raise VocabularyMismatchError.

Modes: ``"ctrlg"`` (HMM guidance) or ``"logical"`` (guidance 1 on every feasible token: the
Outlines/guidance baseline; no HMM needed).

Insertion (Ctrl-G §5): ``suffix_ids`` must follow the generation; the guide's tables require the
HMM to emit them right after the generated middle (see :mod:`ctrlg.guide`), while the LM sees only
the prompt and the middle. :func:`generate` reranks candidates by log p_lm(middle ⊕ suffix | prompt).

If the LM gives every feasible token probability 0 (e.g. −inf logits), the row falls back to the
guidance term alone (a uniform LM), so a feasible token is still chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import LogitsProcessor

from ctrlg.dfa.core import TokenDFA
from ctrlg.errors import ConstraintError, VocabularyMismatchError
from ctrlg.guide import GuideTables

__all__ = ["ConstraintLogitsProcessor", "Generation", "generate", "rerank", "lm_log_likelihood"]

MODES = ("ctrlg", "logical")


def _eos_list(eos_token_id) -> list[int]:
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.reshape(-1).tolist()
    if isinstance(eos_token_id, int):
        return [int(eos_token_id)]
    return [int(e) for e in eos_token_id]


class ConstraintLogitsProcessor(LogitsProcessor):
    """Ctrl-G guidance as a transformers LogitsProcessor (see module docstring).

    Args:
        hmm: a :class:`ctrlg.HMM` (``None`` only with ``mode="logical"``).
        dfa: one :class:`TokenDFA` for every row, or a list with one DFA per input row.
        prompt_length: width of the (left-padded) prompt in ``input_ids``; ``None`` infers it from
            the first call of each generation.
        max_new_tokens: the budget n (must equal the ``max_new_tokens`` given to ``generate``).
        min_new_tokens: EOS is forbidden before this many tokens.
        eos_token_id: id or ids of EOS (terminal tokens); ``None``: generations are n tokens long.
        mode: ``"ctrlg"`` or ``"logical"``.
        suffix_ids: insertion suffix (token ids) the HMM must emit after the generation.
        use_kernel: use the Triton backward-table kernel (default: on CUDA).
        progress: tqdm bar while building tables (default: only on a TTY).

    Raises UnsatisfiableConstraintError at construction when a DFA cannot be satisfied within
    ``max_new_tokens`` tokens, VocabularyMismatchError when the DFA and HMM vocabularies differ.
    """

    def __init__(self, hmm, dfa: TokenDFA | Sequence[TokenDFA], prompt_length: int | None = None,
                 max_new_tokens: int = 32, min_new_tokens: int = 0, eos_token_id=None,
                 mode: str = "ctrlg", suffix_ids: Sequence[int] | None = None,
                 use_kernel: bool | None = None, progress: bool | None = None):
        if mode not in MODES:
            raise ConstraintError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "ctrlg" and hmm is None:
            raise ConstraintError("mode='ctrlg' needs an HMM (use mode='logical' for feasibility only)")
        dfas = [dfa] if isinstance(dfa, TokenDFA) else list(dfa)
        if not dfas:
            raise ConstraintError("dfa must be a TokenDFA or a non-empty list of TokenDFAs")
        for i, d in enumerate(dfas):
            if not isinstance(d, TokenDFA):
                raise ConstraintError(f"dfa[{i}] is a {type(d).__name__}, not a TokenDFA")
            if d.vocab_size != dfas[0].vocab_size:
                raise VocabularyMismatchError(
                    f"dfa[{i}] has vocabulary size {d.vocab_size} but dfa[0] has {dfas[0].vocab_size}")
            if hmm is not None and d.vocab_size != hmm.vocab_size:
                raise VocabularyMismatchError(
                    f"dfa[{i}] has vocabulary size {d.vocab_size} but the HMM has {hmm.vocab_size}")
        if prompt_length is not None and int(prompt_length) < 0:
            raise ConstraintError(f"prompt_length must be ≥ 0, got {prompt_length}")
        self.hmm = hmm if mode == "ctrlg" else None
        self.dfas = dfas
        self.mode = mode
        self.vocab_size = dfas[0].vocab_size
        self.max_new_tokens, self.min_new_tokens = int(max_new_tokens), int(min_new_tokens)
        self.eos_ids = _eos_list(eos_token_id)
        self.suffix_ids = None if suffix_ids is None else [int(t) for t in suffix_ids]
        self._fixed_prompt_length = None if prompt_length is None else int(prompt_length)
        self.prompt_length = self._fixed_prompt_length
        self.tables: list[GuideTables] = []
        self._table_of_dfa: list[int] = []
        built: dict[int, int] = {}
        for d in dfas:  # rows that share a DFA object share its tables
            if id(d) not in built:
                t = GuideTables(d, self.hmm, self.max_new_tokens, min_tokens=self.min_new_tokens,
                                eos_token_id=self.eos_ids or None, suffix_ids=self.suffix_ids,
                                use_kernel=use_kernel, progress=progress)
                t.check_satisfiable()
                built[id(d)] = len(self.tables)
                self.tables.append(t)
            self._table_of_dfa.append(built[id(d)])
        self.reset()

    def reset(self) -> None:
        """Forget the row states (a new ``generate`` call starts)."""
        self._cache: dict[tuple, tuple[int, torch.Tensor | None]] = {}
        self._last_width = -1
        self.prompt_length = self._fixed_prompt_length

    # ------------------------------------------------------------------ row states
    def _root(self, dfa_index: int) -> tuple[int, torch.Tensor | None]:
        table = self.tables[self._table_of_dfa[dfa_index]]
        prior = table.initial_prior()[0] if self.hmm is not None else None
        return table.dfa.initial, prior

    def _states_for(self, keys: list[tuple]) -> list[tuple[int, torch.Tensor | None]]:
        """DFA state and prior for each (dfa index, generated tuple), from the cached parents."""
        out: list = [None] * len(keys)
        pending: dict[int, list[tuple[int, tuple, int, torch.Tensor | None]]] = {}
        for i, key in enumerate(keys):
            if key in self._cache:
                out[i] = self._cache[key]
                continue
            dfa_index, generated = key
            if not generated:
                out[i] = self._root(dfa_index)
                continue
            parent = (dfa_index, generated[:-1])
            if parent not in self._cache:  # not from the previous call: replay from the root
                self._cache[parent] = self._replay(dfa_index, generated[:-1])
            state, prior = self._cache[parent]
            nxt = self.dfas[dfa_index].step(state, generated[-1])
            pending.setdefault(self._table_of_dfa[dfa_index], []).append((i, key, nxt, prior))
        for table_index, items in pending.items():
            if self.hmm is not None:
                priors = torch.stack([p for _, _, _, p in items])
                tokens = [key[1][-1] for _, key, _, _ in items]
                priors = self.tables[table_index].advance(priors, tokens)
            for j, (i, key, nxt, _) in enumerate(items):
                out[i] = (nxt, priors[j] if self.hmm is not None else None)
        return out

    def _replay(self, dfa_index: int, generated: tuple) -> tuple[int, torch.Tensor | None]:
        state, prior = self._root(dfa_index)
        table = self.tables[self._table_of_dfa[dfa_index]]
        for tok in generated:
            state = self.dfas[dfa_index].step(state, tok)
            if prior is not None:
                prior = table.advance(prior[None], [tok])[0]
        return state, prior

    @staticmethod
    def _check_rows_match_dfas(prompts: torch.Tensor, per_dfa: int) -> None:
        """transformers expands each input into ``per_dfa`` consecutive identical rows; rows that
        share a DFA but differ reveal a batch whose size does not match the number of DFAs."""
        for lo in range(0, prompts.shape[0], per_dfa):
            for i in range(lo + 1, lo + per_dfa):
                if not torch.equal(prompts[lo], prompts[i]):
                    raise ConstraintError(
                        f"rows {lo} and {i} share DFA {lo // per_dfa} but have different prompts: "
                        f"the number of DFAs ({prompts.shape[0] // per_dfa}) does not match the "
                        f"number of input rows; give one DFA per input row")

    # ------------------------------------------------------------------ the protocol
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        B, T = input_ids.shape
        V = self.vocab_size
        if scores.shape[1] < V:
            raise VocabularyMismatchError(
                f"the LM scores have {scores.shape[1]} columns but the constraint's vocabulary has "
                f"{V} tokens")
        if scores.shape[0] != B:
            raise ConstraintError(f"scores have {scores.shape[0]} rows but input_ids has {B}")
        k = len(self.dfas)
        if B % k:
            raise ConstraintError(
                f"the batch has {B} rows (inputs × beams/samples), which is not a multiple of the "
                f"number of DFAs ({k}); give one DFA per input row")
        if self._fixed_prompt_length is None and (self.prompt_length is None or T <= self._last_width):
            self.reset()
            self.prompt_length = T
        elif self._fixed_prompt_length is not None and T <= self._last_width:
            self.reset()
        self._last_width = T
        P = self.prompt_length
        if T == P and k > 1:
            self._check_rows_match_dfas(input_ids, B // k)
        if T < P:
            raise ConstraintError(f"input_ids has {T} columns, fewer than prompt_length={P}")
        generated_len = T - P
        remaining = self.max_new_tokens - generated_len
        per_dfa = B // k
        rows_ids = input_ids[:, P:].tolist()
        eos = set(self.eos_ids)
        active = [i for i in range(B) if not eos.intersection(rows_ids[i])]
        if active and remaining < 1:
            raise ConstraintError(
                f"generation reached token {generated_len + 1} but the processor was built for "
                f"max_new_tokens={self.max_new_tokens}; pass the same max_new_tokens to generate")
        keys = [(i // per_dfa, tuple(rows_ids[i])) for i in active]
        states = self._states_for(keys)
        self._cache = dict(zip(keys, states))

        if not active:
            return scores
        dev = scores.device
        groups: dict[int, list[int]] = {}
        for j, i in enumerate(active):
            groups.setdefault(self._table_of_dfa[i // per_dfa], []).append(j)
        ratio = None
        for table_index, js in groups.items():
            table = self.tables[table_index]
            live = [j for j in js if table.feasible[remaining, states[j][0]]]
            if not live:  # rows in dead states (possible only for non-top beams): all −inf
                continue
            priors = torch.stack([states[j][1] for j in live]) if self.hmm is not None else None
            r = table.log_ratio([states[j][0] for j in live], priors, remaining).to(dev)
            if len(live) == len(active):
                ratio = r
            else:
                if ratio is None:
                    ratio = torch.full((len(active), V), -math.inf, device=dev)
                ratio[torch.tensor(live, device=dev)] = r
        if ratio is None:
            ratio = torch.full((len(active), V), -math.inf, device=dev)
        everyone = len(active) == B
        active_t = None if everyone else torch.tensor(active, device=dev)
        lm = scores[:, :V] if everyone else scores[active_t, :V]
        guided = lm.float() + ratio
        lse = torch.logsumexp(guided, 1, keepdim=True)
        bad = ~torch.isfinite(lse[:, 0])
        guided = guided - lse
        if bool(bad.any()):
            # the LM gives every feasible token probability 0: use the guidance alone; rows in
            # dead states (no feasible token) stay all −inf
            fallback = torch.log_softmax(ratio[bad], -1)
            guided[bad] = torch.where(torch.isnan(fallback), -math.inf, fallback)
        if everyone and scores.shape[1] == V:
            return guided.to(scores.dtype)
        out = scores.clone()
        rows = slice(None) if everyone else active_t
        out[rows, :V] = guided.to(out.dtype)
        out[rows, V:] = -math.inf
        return out


# ---------------------------------------------------------------------- helpers
@dataclass
class Generation:
    """One accepted output: decoded text, generated token ids (EOS included if it ended the
    generation) and its LM log-likelihood log p_lm(ids [+ suffix] | prompt)."""

    text: str
    token_ids: list[int]
    lm_log_likelihood: float = float("nan")
    extra: dict = field(default_factory=dict)


def _lm_vocab_size(model) -> int:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and hasattr(out, "weight"):
        return int(out.weight.shape[0])
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


@torch.no_grad()
def lm_log_likelihood(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
                      batch_size: int = 16) -> list[float]:
    """log p_lm(candidate | prompt) for each candidate (sum of token log-probabilities)."""
    device = next(model.parameters()).device
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConstraintError("lm_log_likelihood needs a non-empty prompt (at least a BOS token)")
    scores: list[float] = []
    for lo in range(0, len(candidates), batch_size):
        chunk = [list(map(int, c)) for c in candidates[lo:lo + batch_size]]
        width = len(prompt) + max((len(c) for c in chunk), default=0)
        ids = torch.zeros(len(chunk), width, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for i, c in enumerate(chunk):
            seq = prompt + c
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        for i, c in enumerate(chunk):
            P = len(prompt)
            scores.append(float(logp[i, P - 1:P - 1 + len(c)].sum()))
    return scores


def rerank(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
           suffix_ids: Sequence[int] | None = None) -> list[tuple[float, list[int]]]:
    """Candidates sorted by LM log-likelihood, best first: ``[(log p_lm, candidate), ...]``.
    With ``suffix_ids`` the score is log p_lm(candidate ⊕ suffix | prompt) (Ctrl-G §5)."""
    suffix = [int(t) for t in suffix_ids] if suffix_ids else []
    scores = lm_log_likelihood(model, prompt_ids, [list(c) + suffix for c in candidates])
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])
    return [(scores[i], list(candidates[i])) for i in order]


def generate(model, tokenizer, prompt, constraint: TokenDFA, *, hmm=None, max_new_tokens: int = 32,
             min_new_tokens: int = 0, num_samples: int = 8, seed: int = 0, rerank: bool = True,
             mode: str = "ctrlg", suffix=None, num_beams: int = 1, do_sample: bool | None = None,
             eos_token_id=None, **generate_kwargs) -> list[Generation]:
    """Generate with Ctrl-G guidance and return the accepted outputs (distinct token sequences),
    best LM log-likelihood first when ``rerank`` (else in generation order).

    ``prompt``: a string (tokenised with ``tokenizer``) or token ids. ``constraint``: a TokenDFA over
    the LM's token ids. ``suffix``: text or ids that must follow (insertion). Sampling draws
    ``num_samples`` outputs (``do_sample`` defaults to ``num_beams == 1``); beam search returns
    ``num_samples`` beams of ``max(num_beams, num_samples)``. Extra keyword arguments go to
    ``model.generate`` (temperature, top_k, top_p, ...), whose warpers run after the guidance.
    """
    if mode == "ctrlg" and hmm is None:
        raise ConstraintError("generate(mode='ctrlg') needs hmm=...; use mode='logical' without one")
    lm_vocab = _lm_vocab_size(model)
    if hmm is not None and hmm.vocab_size > lm_vocab:
        raise VocabularyMismatchError(
            f"the HMM has vocabulary size {hmm.vocab_size} but the LM outputs only {lm_vocab} logits")
    if constraint.vocab_size > lm_vocab:
        raise VocabularyMismatchError(
            f"the DFA has vocabulary size {constraint.vocab_size} but the LM outputs only {lm_vocab} logits")
    if isinstance(prompt, str):
        prompt_ids = tokenizer(prompt).input_ids
    else:
        prompt_ids = [int(t) for t in prompt]
    if not prompt_ids:
        raise ConstraintError("the prompt is empty; give at least a BOS token")
    suffix_ids = None
    if suffix is not None:
        suffix_ids = tokenizer(suffix, add_special_tokens=False).input_ids if isinstance(suffix, str) \
            else [int(t) for t in suffix]
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    eos_ids = _eos_list(eos_token_id)
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=len(prompt_ids),
                                     max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                                     eos_token_id=eos_ids or None, mode=mode, suffix_ids=suffix_ids)
    if do_sample is None:
        do_sample = num_beams == 1
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    torch.manual_seed(int(seed))
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(int(seed))
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
                  num_return_sequences=num_samples, logits_processor=[proc],
                  attention_mask=torch.ones_like(input_ids), pad_token_id=pad,
                  eos_token_id=eos_ids or None)
    if num_beams > 1:
        kwargs["num_beams"] = max(num_beams, num_samples)
    kwargs.update(generate_kwargs)
    output = model.generate(input_ids, **kwargs)
    results: list[Generation] = []
    seen = set()
    eos_set = set(eos_ids)
    for row in output[:, len(prompt_ids):].tolist():
        ids = []
        for tok in row:
            ids.append(tok)
            if tok in eos_set:
                break
        ended = bool(ids) and ids[-1] in eos_set
        if not ended and len(ids) < max_new_tokens:
            continue
        if not constraint.accepts(ids) or tuple(ids) in seen:
            continue
        seen.add(tuple(ids))
        body = ids[:-1] if ended else ids
        text = tokenizer.decode(body, skip_special_tokens=True) if tokenizer is not None else ""
        results.append(Generation(text=text, token_ids=ids))
    if rerank and results:
        bodies = [g.token_ids[:-1] if g.token_ids and g.token_ids[-1] in eos_set and suffix_ids
                  else g.token_ids for g in results]
        scores = lm_log_likelihood(model, prompt_ids, [b + (suffix_ids or []) for b in bodies])
        for g, s in zip(results, scores):
            g.lm_log_likelihood = s
        results.sort(key=lambda g: -g.lm_log_likelihood)
    return results
