"""A second LM as the judge of finished candidates: log p_judge(y | judge prompt), scored with the
prompt's key/value cache shared by every candidate.

Reranking K finished candidates y_1..y_K of one item by a judge LM that reads its own prompt c
(e.g. an instruction naming the concepts) costs one forward pass over c and one over the K
candidates' tokens: |c| + Σ_k |y_k| token-steps (≈ 2·N FLOPs each for an N-parameter LM) instead
of K·|c| + Σ_k |y_k| when every row repeats the prompt. With a 45-token instruction and 16
candidates of 15 tokens that is 285 token-steps against 960.

The score is exact: log p(y | c) = Σ_t log p(y_t | c, y_<t), the first term read from the
prompt's last logits, the rest from the candidates' pass over the cached prompt (right-padded
rows; a padded position attends only to the prompt and to the tokens before it, so it never
changes a real token's logits).
"""

from __future__ import annotations

import copy
import json
from typing import Sequence

import torch

from ctrlg.errors import ConstraintError, CtrlgError
from ctrlg.lm.adapters import base_fingerprint
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.vocab import tokenizer_fingerprint

__all__ = ["Judge", "JudgeCacheError", "judge_identity", "judge_log_likelihoods"]


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


@torch.no_grad()
def judge_log_likelihoods(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
                          batch_size: int = 32) -> list[float]:
    """log p_model(candidate | prompt) for each candidate (the sum of its token log-probabilities;
    an empty candidate scores 0), the prompt encoded once and its cache shared by every batch."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConstraintError("judge_log_likelihoods needs a non-empty prompt (at least a BOS token)")
    device = next(model.parameters()).device
    prompt_tensor = torch.tensor([prompt], device=device)
    start = model(input_ids=prompt_tensor, use_cache=True)
    prompt_cache, keyword = returned_cache(start), cache_keyword(model)
    first = torch.log_softmax(start.logits[0, -1].float(), -1)
    scores: list[float] = []
    for lo in range(0, len(candidates), batch_size):
        chunk = [[int(t) for t in c] for c in candidates[lo:lo + batch_size]]
        width = max((len(c) for c in chunk), default=0)
        if width == 0:
            scores.extend(0.0 for _ in chunk)
            continue
        ids = torch.zeros(len(chunk), width, dtype=torch.long, device=device)
        mask = torch.zeros(len(chunk), len(prompt) + width, dtype=torch.long, device=device)
        mask[:, :len(prompt)] = 1
        for i, c in enumerate(chunk):
            if c:
                ids[i, :len(c)] = torch.tensor(c, device=device)
                mask[i, len(prompt):len(prompt) + len(c)] = 1
        cache = copy.deepcopy(prompt_cache)
        cache.batch_repeat_interleave(len(chunk))
        logits = model(input_ids=ids, attention_mask=mask, use_cache=True,
                       **{keyword: cache}).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        for i, c in enumerate(chunk):
            if not c:
                scores.append(0.0)
                continue
            scores.append(float(first[c[0]]) + float(logp[i, :len(c) - 1].sum()))
    return scores


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
        prompt = tuple(int(t) for t in prompt_ids)
        missing = list(dict.fromkeys(t for t in texts if (prompt, t) not in self.memo))
        if missing:
            values = judge_log_likelihoods(self.model, prompt, [self.encode(t) for t in missing],
                                           batch_size=self.batch_size)
            self.memo.update({(prompt, t): v for t, v in zip(missing, values)})
        return [self.memo[(prompt, t)] for t in texts]

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
