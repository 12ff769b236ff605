"""ReLM-style regular-expression queries over a language model (Kuchnik et al., MLSys 2023, §3).

A :class:`Query` names a regular language of strings (``pattern``), an optional ``prefix``
regex that the results start with, a decision rule (``top_k``: every query token must be among
the LM's k most likely next tokens; prefix tokens are exempt), the token encodings that count
(``"canonical"`` or ``"all"``, see :func:`ctrlg.dfa.regex`), a token budget, and whether the
result must end with EOS. Optional preprocessing widens the language to strings within edit
distance ``k`` (:mod:`ctrlg.relm.edits`) and filters drop results (e.g. containing stop words).

The token sequences x = u·w considered are those with ``decode(u) ∈ L(prefix)`` (tokenised on
its own) and ``decode(w) ∈ L(pattern)``; their score is

    log p(x) = Σ_i log p_lm(x_i | context, x_<i)   (+ log p_lm(EOS | context, x) if require_eos),

with ``context`` the BOS token (or ``context_ids``). Two traversals:

* :func:`search` — **shortest path**: Dijkstra on edge weights −log p_lm ≥ 0 over the tree of
  token prefixes, restricted to the automaton's live states. The LM is called on batches of the
  ``batch_size`` cheapest frontier nodes. A result is yielded when it is the cheapest entry of the
  priority queue, so results stream in non-increasing probability; it is exact whatever the
  batch size, because children never cost less than their parents.
* :func:`sample` — **random sampling** (ReLM §3.3): the prefix is drawn uniformly among the
  prefix automaton's accepted token paths of at most ``max_tokens`` tokens (walk counts
  ``N_r(s)`` make the choice unbiased by how many strings each branch holds), then the rest is
  drawn from the LM restricted to the automaton (and the decision rule): p(v) ∝ p_lm(v) on allowed
  tokens. At an accepting state, stopping has the LM's EOS probability. A batch of samples is
  decoded incrementally, one forward per step over the rows' new tokens
  (:class:`ctrlg.relm.row_decoder.RowDecoder`).
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from ctrlg.dfa.bytes_dfa import compile_bytes_dfa
from ctrlg.dfa.canonical import canonical_token_dfa
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.ops import bfs_distances, min_tokens_to_accept
from ctrlg.dfa.regex_index import token_dfa_from_bytes_dfa
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.lm.shared_context import SharedContext, right_padded
from ctrlg.relm.edits import DEFAULT_EDIT_SYMBOLS, within_edit_distance
from ctrlg.relm.row_decoder import RowDecoder
from ctrlg.validation import check_context_length, check_count
from ctrlg.vocab import as_vocabulary, lm_vocab_size

__all__ = ["Query", "QueryResult", "search", "sample", "exclude_words", "compile_query"]


@dataclass(frozen=True)
class Query:
    """A ReLM query (module docstring).

    Attributes:
        pattern: regex of the query part (full match).
        prefix: optional regex the result starts with; exempt from the decision rule.
        top_k: decision rule: query tokens must be among the LM's ``top_k`` most likely tokens
            (None: all tokens).
        encodings: ``"canonical"`` (the tokenizer's own segmentation) or ``"all"``.
        max_tokens: budget for prefix + query tokens (EOS not counted).
        require_eos: results end with EOS (scored) instead of stopping at any full match.
        edit_distance / edit_symbols: widen ``pattern`` to strings within this many insertions,
            deletions and substitutions of one-byte characters (Levenshtein preprocessor).
        filters: predicates on the result text; results failing one are skipped.
    """

    pattern: str
    prefix: str | None = None
    top_k: int | None = None
    encodings: str = "canonical"
    max_tokens: int = 32
    require_eos: bool = False
    edit_distance: int = 0
    edit_symbols: str | None = None
    filters: tuple[Callable[[str], bool], ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ConstraintError(f"top_k must be a positive int or None, got {self.top_k!r}")
        check_count("max_tokens", self.max_tokens, minimum=1)
        if self.encodings not in ("canonical", "all"):
            raise ConstraintError(
                f"encodings must be 'canonical' or 'all', got {self.encodings!r}")


@dataclass(frozen=True)
class QueryResult:
    """One match: its text, tokens (prefix + query, and EOS if required) and log probability."""
    text: str
    token_ids: tuple[int, ...]
    log_prob: float
    prefix_length: int


def exclude_words(words: Sequence[str], case_sensitive: bool = False) -> Callable[[str], bool]:
    """A result filter rejecting texts that contain any of ``words`` as a whole word
    (e.g. stop words)."""
    if not words:
        raise ConstraintError("exclude_words needs at least one word")
    flags = 0 if case_sensitive else re.IGNORECASE
    matcher = re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")\b", flags)
    return lambda text: matcher.search(text) is None


# ---------------------------------------------------------------------- automata
@dataclass
class _Automata:
    prefix: TokenDFA | None
    query: TokenDFA
    prefix_live: np.ndarray | None
    query_live: np.ndarray
    edge_cache: dict = field(default_factory=dict)


def _token_dfa(pattern: str, tokenizer, encodings: str, vocab_size: int, edit_distance: int = 0,
               edit_symbols: str | None = None) -> TokenDFA:
    bdfa = compile_bytes_dfa(pattern)
    if edit_distance:
        bdfa = within_edit_distance(bdfa, edit_distance, edit_symbols or DEFAULT_EDIT_SYMBOLS)
    what = f"regex {pattern!r}"
    if encodings == "canonical":
        return canonical_token_dfa(bdfa, tokenizer, eos_token_id=None, vocab_size=vocab_size,
                                   what=what)
    return token_dfa_from_bytes_dfa(bdfa, vocab_trie(tokenizer), eos_token_id=None,
                                    vocab_size=vocab_size, what=what)


def _shortest_match_bytes(bdfa) -> int | None:
    """Length in bytes of the shortest string a byte DFA accepts (None: it accepts nothing)."""
    Q = bdfa.num_states
    src = np.repeat(np.arange(Q, dtype=np.int64), 256)
    pairs = np.unique(src * Q + bdfa.table.astype(np.int64).ravel())
    dist = bfs_distances([bdfa.initial], pairs // Q, pairs % Q, Q)
    lengths = dist[np.asarray(bdfa.accepting, dtype=bool) & (dist >= 0)]
    return int(lengths.min()) if lengths.size else None


def _budget_error(query: Query, needed: int, why: str) -> UnsatisfiableConstraintError:
    return UnsatisfiableConstraintError(
        f"no match of the query (pattern {query.pattern!r}"
        + (f", prefix {query.prefix!r}" if query.prefix is not None else "")
        + f") fits max_tokens={query.max_tokens}: {why}, so a match needs at least {needed} "
        f"tokens; raise max_tokens to {needed} or more")


def _match_bytes(bdfa) -> bytes:
    """The byte values on transitions between live states of a byte DFA (those a match uses)."""
    live = bdfa.live()
    rows = bdfa.table[live]
    used = np.zeros(256, dtype=bool)
    used[np.nonzero(live[rows])[1]] = True
    return bytes(np.nonzero(used)[0].tolist())


def check_budget_bytes(query: Query, tokenizer) -> None:
    """Before compiling any token automaton: a match of ``b`` bytes needs ≥ ⌈b / L⌉ tokens when
    the longest token made only of bytes the regex can match has L bytes (prefix and query are
    tokenised apart, so their bounds add). O(|vocabulary|) byte scans."""
    tokens = as_vocabulary(tokenizer).tokens
    needed, parts = 0, []
    for name, pattern in (("prefix", query.prefix), ("pattern", query.pattern)):
        if pattern is None or (name == "pattern" and query.edit_distance):
            continue                   # edits may shorten the pattern's matches
        bdfa = compile_bytes_dfa(pattern)
        shortest = _shortest_match_bytes(bdfa)
        if shortest is None:
            raise UnsatisfiableConstraintError(f"the {name} regex {pattern!r} matches no string")
        alphabet = _match_bytes(bdfa)
        longest = max((len(t) for t in tokens if t and not t.translate(None, alphabet)),
                      default=0)
        if longest == 0:
            continue                   # no token fits; the token automaton will say so
        needed += -(-shortest // longest)
        parts.append(f"the shortest {name} match has {shortest} bytes and the longest token "
                     f"it can use has {longest}")
    if needed > query.max_tokens:
        raise _budget_error(query, needed, " and ".join(parts))


def check_budget_tokens(query: Query, autom: "_Automata") -> None:
    """After compiling: the shortest accepted token path (prefix, then query) fits the budget."""
    needed = 0
    for dfa in (autom.prefix, autom.query):
        if dfa is not None:
            shortest = min_tokens_to_accept(dfa)
            if shortest is None:
                raise UnsatisfiableConstraintError(
                    f"the query {query.pattern!r} has no token encoding")
            needed += shortest
    if needed > query.max_tokens:
        raise _budget_error(query, needed, "its shortest token encoding is that long")


def compile_query(query: Query, tokenizer, vocab_size: int) -> _Automata:
    """Token DFAs (without EOS edges) of the query's prefix and pattern. Raises
    UnsatisfiableConstraintError at once when no match fits ``query.max_tokens``."""
    check_budget_bytes(query, tokenizer)
    prefix = None if query.prefix is None else _token_dfa(
        query.prefix, tokenizer, query.encodings, vocab_size)
    body = _token_dfa(query.pattern, tokenizer, query.encodings, vocab_size,
                      query.edit_distance, query.edit_symbols)
    autom = _Automata(prefix, body, None if prefix is None else prefix.live_states(),
                      body.live_states())
    check_budget_tokens(query, autom)
    return autom


# Configurations: (phase, state); phase 0 = inside the prefix, 1 = inside the query.
def _close(autom: _Automata, configs) -> frozenset:
    out = set(configs)
    for phase, s in configs:
        if phase == 0 and autom.prefix.is_accepting(s):
            out.add((1, autom.query.initial))
    return frozenset(out)


def _initial(autom: _Automata) -> frozenset:
    if autom.prefix is None:
        return frozenset({(1, autom.query.initial)})
    return _close(autom, [(0, autom.prefix.initial)])


def _live_edges(autom: _Automata, phase: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, successors) out of ``(phase, s)`` into live states, memoised per automaton."""
    key = (phase, s)
    hit = autom.edge_cache.get(key)
    if hit is None:
        dfa, live = ((autom.prefix, autom.prefix_live) if phase == 0
                     else (autom.query, autom.query_live))
        tokens, succ = _edges(dfa, live, s)
        keep = live[succ]
        tokens, succ = tokens[keep], succ[keep]
        order = np.argsort(tokens, kind="stable")        # sorted for _step's binary search
        hit = autom.edge_cache[key] = (tokens[order], succ[order])
    return hit


def _moves(autom: _Automata, configs: frozenset, allowed_query: np.ndarray | None
           ) -> np.ndarray:
    """The tokens (sorted, unique) that keep some configuration live; ``allowed_query``
    (bool [V]) is the decision rule for query-phase moves."""
    parts = []
    for phase, s in configs:
        tokens, _ = _live_edges(autom, phase, s)
        if phase == 1 and allowed_query is not None:
            tokens = tokens[allowed_query[tokens]]
        parts.append(tokens)
    if len(parts) == 1:
        return parts[0]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def _step(autom: _Automata, configs: frozenset, token: int,
          allowed_query: np.ndarray | None) -> frozenset:
    """The configuration set after ``token`` (one of :func:`_moves`' tokens)."""
    out = []
    for phase, s in configs:
        if phase == 1 and allowed_query is not None and not allowed_query[token]:
            continue
        tokens, succ = _live_edges(autom, phase, s)
        i = int(np.searchsorted(tokens, token))
        if i < len(tokens) and tokens[i] == token:
            out.append((phase, int(succ[i])))
    return _close(autom, out)


def _edges(dfa: TokenDFA, live: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, successors) from state ``s`` that may lead to a live state: the exceptions when
    the default successor is dead, else the whole dense row."""
    if live[dfa.default[s]]:
        return np.arange(dfa.vocab_size), dfa.successors(s)
    return dfa.exceptions(s)


def _accepting(autom: _Automata, configs: frozenset) -> bool:
    return any(phase == 1 and autom.query.is_accepting(s) for phase, s in configs)


# ---------------------------------------------------------------------- LM calls
def _context(tokenizer, context_ids) -> list[int]:
    if context_ids is not None:
        ids = [int(i) for i in context_ids]
        if not ids:
            raise ConstraintError("context_ids must hold at least one token")
        return ids
    for name in ("bos_token_id", "eos_token_id"):
        tid = getattr(tokenizer, name, None)
        if tid is not None:
            return [int(tid)]
    raise ConstraintError("the tokenizer has neither BOS nor EOS; pass context_ids")


class _ContextScorer:
    """log p_lm(· | context, w) for batches of suffixes w, the shared context encoded once.

    Every node of a search or sampling run extends the same context (a LAMBADA passage is ~100
    tokens, a query suffix ≤ 10), so the context's key/value cache is computed once and each call
    runs the model on the suffixes only: O(B·|w|·(|context|+|w|)) attention work and
    O(B·|w|) MLP work instead of O(B·(|context|+|w|)) for the full sequences. Models without a
    reusable :class:`transformers.DynamicCache` fall back to re-encoding the full sequences.
    """

    def __init__(self, model, context: list[int]):
        self.model = model
        self.context = list(context)
        self.shared = SharedContext(model, self.context)
        self.device = self.shared.device
        self.layers = self.shared.layers
        self.context_log_probs = self.shared.next_log_probs

    def _cache(self, batch: int):
        return self.shared.cache(batch)

    def _suffix_logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, W, V] at the positions of the right-padded suffixes ``ids`` [B, W]
        (``mask`` marks their real tokens) after the context."""
        return self.shared.continuation_logits(ids, mask)

    @torch.no_grad()
    def __call__(self, suffixes: list[Sequence[int]]) -> torch.Tensor:
        """float32 [B, V]: the next-token log probabilities after ``context + suffix``."""
        out = torch.empty(len(suffixes), self.context_log_probs.shape[-1])
        rows = [r for r, s in enumerate(suffixes) if len(s)]
        for r, s in enumerate(suffixes):
            if not len(s):
                out[r] = self.context_log_probs
        if not rows:
            return out
        ids, mask, lengths = right_padded([list(suffixes[r]) for r in rows])
        logits = self._suffix_logits(ids, mask)
        last = logits[torch.arange(len(rows)), torch.tensor(lengths) - 1]
        out[rows] = torch.log_softmax(last.float(), dim=-1).cpu()
        return out

    @torch.no_grad()
    def token_log_probs(self, tokens: Sequence[int]) -> torch.Tensor:
        """float32 [n]: log p_lm(tokens[i] | context, tokens[:i]) for each i (one model call)."""
        tokens = [int(t) for t in tokens]
        ids, mask, _ = right_padded([tokens])
        later = torch.log_softmax(self._suffix_logits(ids, mask)[0, :-1].float(), -1).cpu()
        steps = torch.cat([self.context_log_probs[None], later])
        return steps[torch.arange(len(tokens)), torch.tensor(tokens)]


def _vocab_size(model, tokenizer) -> int:
    """The LM's (padded) output width (:func:`ctrlg.vocab.lm_vocab_size`), or the tokenizer's
    size for models that state neither."""
    try:
        return lm_vocab_size(model)
    except VocabularyMismatchError:
        return as_vocabulary(tokenizer).vocab_size


def _topk_mask(log_probs: torch.Tensor, k: int | None) -> np.ndarray | None:
    if k is None:
        return None
    mask = np.zeros(log_probs.shape[-1], dtype=bool)
    mask[torch.topk(log_probs, min(k, log_probs.shape[-1])).indices.numpy()] = True
    return mask


def _decode(tokenizer, ids) -> str:
    return as_vocabulary(tokenizer).decode(ids)


def _passes(query: Query, text: str) -> bool:
    return all(f(text) for f in query.filters)


# ---------------------------------------------------------------------- shortest path
def _prepare(model, tokenizer, query: Query, context_ids):
    """(compiled query automaton, LM context ids, EOS id or None) shared by search and sample."""
    context = _context(tokenizer, context_ids)
    check_context_length(model, len(context), query.max_tokens, what="the query's context")
    autom = compile_query(query, tokenizer, _vocab_size(model, tokenizer))
    return autom, context, getattr(tokenizer, "eos_token_id", None)


_RESULT, _NODE, _SIBLINGS = 0, 1, 2


@dataclass
class _Siblings:
    """The children of one expanded node, sorted by step cost; ``next`` is the first child not
    yet pushed (lazy expansion: a node with thousands of children costs one heap entry per child
    actually reached, not one per child)."""
    parent_cost: float
    parent_tokens: tuple[int, ...]
    configs: frozenset
    prefix_length: int
    allowed: np.ndarray | None
    tokens: np.ndarray
    steps: np.ndarray
    next: int = 0


def search(model, tokenizer, query: Query, *, num_results: int | None = 10, batch_size: int = 8,
           context_ids: Sequence[int] | None = None, max_expansions: int = 100_000,
           stats: dict | None = None) -> Iterator[QueryResult]:
    """Yield matches of ``query`` in non-increasing probability (Dijkstra; module docstring).

    The children of an expanded node enter the priority queue lazily, cheapest first: the
    queue holds one "siblings" entry per expanded node, keyed by the cost of its cheapest
    child not yet pushed, and popping it pushes that child and re-keys the entry with the next.
    The pop order is the same as pushing every child at once.

    Args:
        num_results: stop after this many results (None: exhaust the language within budget).
        batch_size: frontier nodes expanded per LM call.
        context_ids: tokens the LM conditions on (default: BOS, else EOS).
        max_expansions: stop after this many LM-expanded nodes.
        stats: when given, filled as the search runs: ``expansions`` (LM-expanded nodes so far)
            and ``budget_spent`` (True once the search stopped at ``max_expansions`` rather
            than with its language exhausted or ``num_results`` reached).

    Arguments are checked and the query compiled when ``search`` is called (not at the first
    ``next``): bad counts raise ConstraintError and a query with no match within
    ``query.max_tokens`` raises UnsatisfiableConstraintError at once.
    """
    if num_results is not None:
        check_count("num_results", num_results, minimum=1)
    check_count("batch_size", batch_size, minimum=1)
    check_count("max_expansions", max_expansions, minimum=1)
    autom, context, eos = _prepare(model, tokenizer, query, context_ids)
    if query.require_eos and eos is None:
        raise ConstraintError("require_eos=True but the tokenizer has no eos_token_id")
    return _search(model, tokenizer, query, autom, context, eos, num_results, batch_size,
                   max_expansions, {} if stats is None else stats)


def _search(model, tokenizer, query: Query, autom: _Automata, context: list[int], eos,
            num_results: int | None, batch_size: int, max_expansions: int, stats: dict
            ) -> Iterator[QueryResult]:
    """The Dijkstra traversal behind :func:`search` (a generator)."""
    scorer = _ContextScorer(model, context)
    # heap entries: (cost, tie, kind, payload); payload = (tokens, configs, prefix_len) for
    # nodes and results, a _Siblings for sibling groups. ``tie`` is unique: FIFO among equals.
    heap: list = []
    counter = iter(range(1 << 62))

    def push(cost: float, kind: int, payload) -> None:
        heapq.heappush(heap, (cost, next(counter), kind, payload))

    def push_next_sibling(group: _Siblings) -> None:
        if group.next < len(group.tokens):
            push(group.parent_cost + float(group.steps[group.next]), _SIBLINGS, group)

    def reach_child(cost: float, group: _Siblings) -> None:
        token = int(group.tokens[group.next])
        group.next += 1
        push_next_sibling(group)
        nconf = _step(autom, group.configs, token, group.allowed)
        child = group.parent_tokens + (token,)
        cplen = len(child) if any(p == 0 for p, _ in nconf) else group.prefix_length
        push(cost, _NODE, (child, nconf, cplen))
        if not query.require_eos and _accepting(autom, nconf):
            push(cost, _RESULT, (child, nconf, cplen))

    push(0.0, _NODE, ((), _initial(autom), 0))
    emitted: set[tuple[int, ...]] = set()
    produced = expansions = 0
    stats.update(expansions=0, budget_spent=False)
    while heap:
        batch = []
        while heap and len(batch) < batch_size:
            kind = heap[0][2]
            if kind == _RESULT and batch:
                break                      # expand the batch first; results come next round
            cost, _, _, payload = heapq.heappop(heap)
            if kind == _SIBLINGS:
                reach_child(cost, payload)
            elif kind == _NODE:
                batch.append((cost, payload))
            else:
                tokens, _, plen = payload
                if tokens in emitted:
                    continue
                emitted.add(tokens)
                text = _decode(tokenizer, tokens)
                if _passes(query, text):
                    yield QueryResult(text, tokens, -cost, plen)
                    produced += 1
                    if num_results is not None and produced >= num_results:
                        return
        if not batch:
            continue
        expansions += len(batch)
        stats["expansions"] = expansions
        if expansions > max_expansions:
            stats["budget_spent"] = True
            return
        log_probs = scorer([payload[0] for _, payload in batch])
        for (cost, (tokens, configs, plen)), lp in zip(batch, log_probs):
            lp_np = lp.numpy()
            allowed = _topk_mask(lp, query.top_k)
            if query.require_eos and _accepting(autom, configs):
                if allowed is None or allowed[eos]:
                    push(cost - float(lp_np[eos]), _RESULT, (tokens + (eos,), configs, plen))
            if len(tokens) >= query.max_tokens:
                continue
            children = _moves(autom, configs, allowed)
            steps = -lp_np[children].astype(np.float64)
            finite = np.isfinite(steps)
            children, steps = children[finite], steps[finite]
            if not len(children):
                continue
            order = np.argsort(steps, kind="stable")
            push_next_sibling(_Siblings(cost, tokens, configs, plen, allowed, children[order],
                                        steps[order]))
    return


# ---------------------------------------------------------------------- random sampling
def _log_walk_counts(dfa: TokenDFA, live: np.ndarray, horizon: int) -> np.ndarray:
    """log N_r(s) for r = 0..horizon: the number of accepted token paths of length ≤ r from s."""
    S = dfa.num_states
    logN = np.full((horizon + 1, S), -np.inf)
    logN[0, dfa.accepting] = 0.0
    rows = [_edges(dfa, live, s) for s in range(S)]
    for r in range(1, horizon + 1):
        for s in range(S):
            _, succ = rows[s]
            terms = logN[r - 1, succ[live[succ]]]
            if dfa.accepting[s]:
                terms = np.append(terms, 0.0)
            if len(terms):
                logN[r, s] = np.logaddexp.reduce(terms)
    return logN


def _sample_prefix(autom: _Automata, horizon: int, rng: np.random.Generator,
                   logN: np.ndarray) -> list[int]:
    """A token path of the prefix automaton, uniform over its accepted paths of ≤ ``horizon``
    tokens (``logN``: :func:`_log_walk_counts`, computed once per automaton by the caller)."""
    dfa, live = autom.prefix, autom.prefix_live
    if not np.isfinite(logN[horizon, dfa.initial]):
        raise ConstraintError(f"the prefix accepts no token path within {horizon} tokens")
    s, out = dfa.initial, []
    for r in range(horizon, 0, -1):
        tokens, succ = _edges(dfa, live, s)
        keep = live[succ]
        tokens, succ = tokens[keep], succ[keep]
        logits = logN[r - 1, succ]
        options = list(zip(tokens.tolist(), succ.tolist()))
        if dfa.accepting[s]:
            logits = np.append(logits, 0.0)
            options.append((None, None))
        p = np.exp(logits - logN[r, s])
        p = p / p.sum()
        choice = options[int(rng.choice(len(options), p=p))]
        if choice[0] is None:
            return out
        out.append(choice[0])
        s = choice[1]
    return out


def sample(model, tokenizer, query: Query, num_samples: int = 10, *, seed: int = 0,
           batch_size: int = 8, context_ids: Sequence[int] | None = None) -> list[QueryResult]:
    """Draw ``num_samples`` matches by random sampling (ReLM §3.3; module docstring).

    Samples failing a filter are dropped (so fewer may come back); the same seed gives the same
    samples on the same machine.
    """
    check_count("num_samples", num_samples, minimum=1)
    check_count("batch_size", batch_size, minimum=1)
    autom, context, eos = _prepare(model, tokenizer, query, context_ids)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    scorer = _ContextScorer(model, context)
    results: list[QueryResult] = []
    walk_counts = (_log_walk_counts(autom.prefix, autom.prefix_live, query.max_tokens)
                   if autom.prefix is not None else None)
    remaining = num_samples
    while remaining > 0:
        rows = min(batch_size, remaining)
        remaining -= rows
        prefixes = [(_sample_prefix(autom, query.max_tokens, rng, walk_counts)
                     if autom.prefix is not None else []) for _ in range(rows)]
        states = []
        for pre in prefixes:
            states.append(frozenset({(1, autom.query.initial)}) if autom.prefix is not None
                          else _initial(autom))
        seqs = [list(p) for p in prefixes]
        done = [False] * rows
        decoder = RowDecoder(scorer)
        log_probs, scores = decoder.start(prefixes)   # prefix tokens scored in the same pass
        while not all(done):
            chosen: list[int | None] = [None] * rows
            for r in range(rows):
                if done[r]:
                    continue
                lp = log_probs[r]
                allowed = _topk_mask(lp, query.top_k)
                options = (np.zeros(0, dtype=np.int64) if len(seqs[r]) >= query.max_tokens
                           else _moves(autom, states[r], allowed))
                weights = lp[torch.from_numpy(options)].exp().double()
                stop_ok = _accepting(autom, states[r])
                if stop_ok:   # stopping is the last option, with the LM's EOS probability
                    stop = float(lp[eos].exp()) if eos is not None else 1.0
                    weights = torch.cat([weights, torch.tensor([stop], dtype=torch.float64)])
                if not len(weights):
                    done[r] = True          # dead end (budget); dropped below
                    scores[r] = -math.inf
                    continue
                total = float(weights.sum())
                if total <= 0:
                    weights = torch.ones_like(weights)
                    total = float(len(weights))
                k = int(torch.multinomial(weights / total, 1, generator=gen))
                if k == len(options):
                    done[r] = True
                    if query.require_eos:
                        seqs[r].append(eos)
                        scores[r] += float(lp[eos])
                    continue
                choice = int(options[k])
                seqs[r].append(choice)
                scores[r] += float(lp[choice])
                states[r] = _step(autom, states[r], choice, allowed)
                chosen[r] = choice
            if any(c is not None for c in chosen):
                log_probs = decoder.advance(chosen)
        for r in range(rows):
            if math.isinf(scores[r]) and scores[r] < 0:
                continue
            text = _decode(tokenizer, seqs[r])
            if _passes(query, text):
                results.append(QueryResult(text, tuple(seqs[r]), scores[r], len(prefixes[r])))
    return results
