"""A second LM as the judge of finished candidates: log p_judge(y | judge prompt), each item's
prompt and candidates packed into one row, the rows of many items in one forward.

Reranking K finished candidates y_1..y_K of one item by a judge LM that reads its own prompt c
(e.g. an instruction naming the concepts) costs one row of |c| + (the candidates' prefix tree's
inner nodes) token-steps (≈ 2·N FLOPs each for an N-parameter LM) instead of K·(|c| + |y|) when
every candidate is run whole after its own copy of the prompt. Eight beams of one CommonGen item
are near-paraphrases ("A man is standing …" / "A man stands …"), so their tree has about a third
as many inner nodes as their tokens.

The score is exact: log p(y | c) = Σ_t log p(y_t | c, y_<t), the first term read from the
prompt's last logits, the rest from the tree's nodes (a node attends to the prompt and its own
ancestors only, at position |c| + its depth, so its logits are those of its prefix run alone, up
to float rounding).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import torch

from ctrlg.errors import ConstraintError, CtrlgError
from ctrlg.lm.adapters import base_fingerprint
from ctrlg.vocab import tokenizer_fingerprint

__all__ = ["Judge", "JudgeCacheError", "judge_identity", "judge_log_likelihoods",
           "judge_log_likelihoods_many", "prefix_tree"]


class JudgeCacheError(CtrlgError):
    """A saved file of judge scores that another judge LM (or tokenizer, or precision) wrote."""


def judge_identity(model, tokenizer, text_prefix: str = "") -> str:
    """Who wrote a file of judge scores: the weights' fingerprint
    (:func:`ctrlg.lm.adapters.base_fingerprint` of the model as loaded, any adapter merged), the
    tokenizer's (:func:`ctrlg.vocab.tokenizer_fingerprint`), the weights' dtype and, when not
    empty, the text put before each candidate (it changes every score)."""
    dtype = next(model.parameters()).dtype
    identity = f"weights {base_fingerprint(model)} tokenizer {tokenizer_fingerprint(tokenizer)} {dtype}"
    return identity + (f" prefix {json.dumps(text_prefix)}" if text_prefix else "")


def prefix_tree(candidates: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """The candidates' token prefix tree (a trie): ``(tokens, parents, depths, paths)`` with one
    node per distinct non-empty prefix, in an order where every node follows its parent
    (``parents[n] = -1`` for a first token), and ``paths[k]`` the nodes that spell candidate k."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for candidate in candidates:
        node, path = -1, []
        for token in candidate:
            key = (node, int(token))
            child = children.get(key)
            if child is None:
                child = children[key] = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                depths.append(0 if node < 0 else depths[node] + 1)
            path.append(child)
            node = child
        paths.append(path)
    return tokens, parents, depths, paths


def _row_mask(prompt_length: int, parents: Sequence[int], width: int, left_pad: int) -> torch.Tensor:
    """Bool [width, width]: which columns each column of one packed row attends to. The row is
    ``left_pad`` padding columns, the prompt (causal), then the tree's nodes (``parents`` indexes
    nodes of the same row, −1 for a first token): a node sees the whole prompt, its ancestors and
    itself. Padding columns see only themselves (their outputs are never read)."""
    allowed = torch.eye(width, dtype=torch.bool)
    lo, start = left_pad, left_pad + prompt_length
    allowed[lo:start, lo:start] = torch.ones(prompt_length, prompt_length, dtype=torch.bool).tril()
    for node, parent in enumerate(parents):
        row = start + node
        allowed[row, lo:start] = True
        if parent >= 0:
            allowed[row, start:row] = allowed[start + parent, start:row]
    return allowed


@dataclass(frozen=True)
class _PackedRow:
    """One row of :func:`judge_log_likelihoods_many`: request ``request``'s prompt and the prefix
    tree (:func:`prefix_tree`) of its candidates from index ``offset``; ``inner`` are the tree's
    nodes with children (the ones run), ``source[n]`` the column of the row's kept logits that
    scores node n's token (0: after the prompt; 1 + i: after inner node ``inner[i]``)."""

    request: int
    offset: int
    prompt: list
    tokens: list
    paths: list
    inner: list
    inner_depths: list
    inner_parents: list      # the parent of each inner node as an index into ``inner`` (−1: none)
    source: list

    @property
    def width(self) -> int:
        return len(self.prompt) + len(self.inner)


def _packed_rows(requests, batch_size: int) -> list[_PackedRow]:
    """One row per (request, chunk of ``batch_size`` candidates)."""
    rows = []
    for r, (prompt, candidates) in enumerate(requests):
        for lo in range(0, max(len(candidates), 1), batch_size):
            tokens, parents, depths, paths = prefix_tree(candidates[lo:lo + batch_size])
            inner = sorted({p for p in parents if p >= 0})
            row_of = {node: i for i, node in enumerate(inner)}
            rows.append(_PackedRow(r, lo, prompt, tokens, paths, inner, [depths[n] for n in inner],
                                   [row_of.get(parents[n], -1) for n in inner],
                                   [0 if p < 0 else 1 + row_of[p] for p in parents]))
    return rows


@torch.no_grad()
def judge_log_likelihoods_many(model, requests: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
                               batch_size: int = 32, max_positions: int = 2048) -> list[list[float]]:
    """log p_model(candidate | prompt) of every candidate of every ``(prompt, candidates)``
    request (the sum of its token log-probabilities; an empty candidate scores 0).

    Each request's candidates (``batch_size`` at a time) are packed with its prompt into one row:
    the prompt, then the candidates' prefix tree (:func:`prefix_tree`) without its leaves, each
    node at position |prompt| + its depth and attending to the prompt and its own ancestors
    (tree attention, as speculative decoders verify draft trees). A shared prefix is run once and
    a leaf (every candidate's last token) not at all: its token is scored by its parent's logits,
    a first token by the prompt's last. The rows of all requests go through the LM together, at
    most ``max_positions`` columns per forward, prompts right-aligned so that the logits read are
    those of a few shared columns: one weight pass serves many items, where a decoding step of a
    small LM is bound by reading its weights."""
    requests = [([int(t) for t in p], [[int(t) for t in c] for c in cands]) for p, cands in requests]
    for prompt, _ in requests:
        if not prompt:
            raise ConstraintError("judge_log_likelihoods needs a non-empty prompt (at least a BOS token)")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    scores = [[0.0] * len(cands) for _, cands in requests]
    groups, group, widest = [], [], 0
    for row in sorted(_packed_rows(requests, int(batch_size)), key=lambda row: len(row.prompt)):
        widest = max(widest, row.width)
        if group and widest * (len(group) + 1) > max_positions:
            groups.append(group)
            group, widest = [], row.width
        group.append(row)
    if group:
        groups.append(group)
    for group in groups:
        _score_rows(model, group, scores, device, dtype)
    return scores


def _score_rows(model, group: list[_PackedRow], scores, device, dtype) -> None:
    """Run one forward over the packed rows of ``group`` and write each candidate's score."""
    prompt_width = max(len(row.prompt) for row in group)
    width = prompt_width + max(len(row.inner) for row in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    positions = torch.zeros(len(group), width, dtype=torch.long)
    allowed = torch.zeros(len(group), width, width, dtype=torch.bool)
    for b, row in enumerate(group):
        pad = prompt_width - len(row.prompt)
        ids[b, pad:prompt_width] = torch.tensor(row.prompt)
        positions[b, pad:prompt_width] = torch.arange(len(row.prompt))
        if row.inner:
            nodes = slice(prompt_width, prompt_width + len(row.inner))
            ids[b, nodes] = torch.tensor([row.tokens[n] for n in row.inner])
            positions[b, nodes] = len(row.prompt) + torch.tensor(row.inner_depths)
        allowed[b] = _row_mask(len(row.prompt), row.inner_parents, width, pad)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    keep = torch.arange(prompt_width - 1, width)       # the prompt's last column and the nodes
    logits = model(input_ids=ids.to(device), position_ids=positions.to(device),
                   attention_mask=mask[:, None].to(device), logits_to_keep=keep.to(device)).logits
    for b, row in enumerate(group):
        if not row.tokens:                 # every candidate of the row is empty: scores 0
            continue
        logp = torch.log_softmax(
            logits[b].index_select(0, torch.tensor(row.source, device=device)).float(), -1)
        node_logp = logp.gather(-1, torch.tensor(row.tokens, device=device)[:, None])[:, 0].cpu()
        for k, path in enumerate(row.paths):
            scores[row.request][row.offset + k] = float(node_logp[path].sum()) if path else 0.0


def judge_log_likelihoods(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
                          batch_size: int = 32) -> list[float]:
    """log p_model(candidate | prompt) for each candidate: :func:`judge_log_likelihoods_many`
    of one request."""
    return judge_log_likelihoods_many(model, [(prompt_ids, candidates)], batch_size=batch_size)[0]


class Judge:
    """A judge LM over candidate *texts*: ``score(prompt_ids, texts)`` is
    log p_judge(text ⊕ end | prompt) for each text (:func:`judge_log_likelihoods`), where each
    text is encoded by the judge's own tokenizer without special tokens, after ``text_prefix``
    (" " for a judge trained on prompt + " " + sentence, as the CommonGen adapters are:
    :func:`ctrlg.data.commongen_prompts.target_prefix`), and ``end`` is the tokenizer's EOS (for
    a chat model: its end-of-turn token). Scores are memoised per
    (prompt, text), so re-ranking the same candidates under several rules scores each once;
    :meth:`save_memo` / :meth:`load_memo` keep them across processes (a JSON-lines file)."""

    def __init__(self, model, tokenizer, *, batch_size: int = 32, text_prefix: str = ""):
        if tokenizer.eos_token_id is None:
            raise ConstraintError("the judge's tokenizer has no EOS token to end a candidate")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, int(batch_size)
        self.text_prefix = str(text_prefix)
        self._end = [int(tokenizer.eos_token_id)]
        self.memo: dict[tuple, float] = {}   # (prompt ids, text) -> log p_judge
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        """:func:`judge_identity` of this judge (computed once)."""
        if self._identity is None:
            self._identity = judge_identity(self.model, self.tokenizer, self.text_prefix)
        return self._identity

    def encode(self, text: str) -> list[int]:
        """The judge's tokens of one candidate: the text prefix and the stripped text, then the
        EOS token."""
        return self.tokenizer(self.text_prefix + " ".join(text.split()),
                              add_special_tokens=False)["input_ids"] + self._end

    def score(self, prompt_ids: Sequence[int], texts: Sequence[str]) -> list[float]:
        return self.score_many([(prompt_ids, texts)])[0]

    def score_many(self, requests: Sequence[tuple[Sequence[int], Sequence[str]]]) -> list[list[float]]:
        """:meth:`score` of several ``(prompt ids, texts)`` requests (one per item of a batch):
        the texts not memoised yet are scored together (:func:`judge_log_likelihoods_many`)."""
        keyed = [(tuple(int(t) for t in prompt), list(texts)) for prompt, texts in requests]
        missing: dict[tuple, list[str]] = {}
        for prompt, texts in keyed:
            todo = missing.setdefault(prompt, [])
            todo.extend(t for t in dict.fromkeys(texts) if (prompt, t) not in self.memo and t not in todo)
        missing = {p: texts for p, texts in missing.items() if texts}
        if missing:
            values = judge_log_likelihoods_many(
                self.model, [(p, [self.encode(t) for t in texts]) for p, texts in missing.items()],
                batch_size=self.batch_size)
            for (prompt, texts), scored in zip(missing.items(), values):
                self.memo.update({(prompt, t): v for t, v in zip(texts, scored)})
        return [[self.memo[(prompt, t)] for t in texts] for prompt, texts in keyed]

    def save_memo(self, path) -> None:
        """Write every memoised score as JSON lines ``{"prompt": [...], "text": ..., "score": ...}``
        after a first line ``{"judge": identity}`` (:attr:`identity`)."""
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"judge": self.identity}) + "\n")
            for (prompt, text), value in self.memo.items():
                handle.write(json.dumps({"prompt": list(prompt), "text": text, "score": value}) + "\n")

    def load_memo(self, path) -> int:
        """Add the scores of a file written by :meth:`save_memo`; returns how many were read.
        Raises :class:`JudgeCacheError` when the file names another judge (a file without the
        ``judge`` line, written before it existed, is read as this judge's)."""
        count = 0
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    if "judge" in row:
                        if row["judge"] != self.identity:
                            raise JudgeCacheError(
                                f"{path}: judge scores written by another judge ({row['judge']}); "
                                f"this judge is {self.identity}. Use another --judge-cache file.")
                        continue
                    self.memo[(tuple(int(t) for t in row["prompt"]), row["text"])] = float(row["score"])
                    count += 1
        return count
