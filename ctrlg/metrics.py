"""Offline text-generation metrics for the experiments (CommonGen, infilling).

* **BLEU-4** (Papineni et al. 2002): corpus-level, geometric mean of clipped 1–4-gram precisions
  times the brevity penalty, multiple references per item — pycocoevalcap's ``Bleu(4)``, the
  implementation behind the CommonGen leaderboard and Ctrl-G's tables.
* **ROUGE-L** (Lin 2004): F-measure of the longest common subsequence, best reference per item,
  averaged over items — ``rouge_score``'s ``RougeScorer(["rougeL"]).score_multi``.
* **CIDEr** (Vedantam et al. 2015, the CIDEr-D variant: TF-IDF n-gram vectors, Gaussian length
  penalty σ=6, clipped counts, ×10) — pycocoevalcap's ``Cider``. Its IDF is estimated from the
  references of the evaluated corpus, so it needs several items to be meaningful (a one-item
  corpus scores 0).
* **METEOR 1.5** (Denkowski & Lavie 2014) — pycocoevalcap's ``Meteor``, which runs a bundled Java
  jar; reported only when ``java`` is on ``PATH`` (otherwise ``None``).
* **Constraint success**: percentage of outputs that satisfy their constraint.

Texts are tokenised by :func:`tokenize_for_eval` before BLEU/CIDEr/METEOR (lower-case, words and
numbers kept, punctuation dropped — what the COCO PTB tokenizer yields for plain sentences,
without its Java dependency). BLEU, ROUGE-L and METEOR are returned on a 0–100 scale; :func:`cider`
returns the native 0–10 scale and :func:`evaluate_generations` multiplies it by 100, as CommonGen
tables print it.
"""

from __future__ import annotations

import re
import shutil
from typing import Iterable, Sequence

from ctrlg.errors import CtrlgError

__all__ = [
    "MetricInputError",
    "tokenize_for_eval",
    "bleu4",
    "rouge_l",
    "cider",
    "meteor",
    "java_available",
    "success_rate",
    "keyword_groups_covered",
    "evaluate_generations",
]


class MetricInputError(CtrlgError):
    """Hypotheses and references that do not line up, or are empty."""


_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokenize_for_eval(text: str) -> str:
    """Lower-case, keep word/number tokens (with an apostrophe suffix such as ``'s``), drop
    punctuation, join by single spaces."""
    return " ".join(_TOKEN.findall(text.lower()))


def _check(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
    if len(hypotheses) != len(references):
        raise MetricInputError(f"got {len(hypotheses)} hypotheses but {len(references)} "
                               f"reference lists")
    if not hypotheses:
        raise MetricInputError("no hypotheses to score")
    for index, refs in enumerate(references):
        if isinstance(refs, str) or len(refs) == 0:
            raise MetricInputError(f"item {index}: references must be a non-empty list of "
                                   f"strings, got {refs!r:.80}")


def _coco_inputs(hypotheses, references):
    _check(hypotheses, references)
    gts = {i: [tokenize_for_eval(r) for r in refs] for i, refs in enumerate(references)}
    res = {i: [tokenize_for_eval(h)] for i, h in enumerate(hypotheses)}
    return gts, res


def bleu4(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU-4 × 100 (pycocoevalcap)."""
    from pycocoevalcap.bleu.bleu import Bleu  # optional metrics dependency, imported only when this metric runs

    gts, res = _coco_inputs(hypotheses, references)
    # pycocoevalcap asserts a non-empty hypothesis; an empty output scores like one unknown word
    res = {i: [h[0] if h[0] else "<empty>"] for i, h in res.items()}
    scores, _ = Bleu(4).compute_score(gts, res, verbose=0)
    return 100.0 * float(scores[3])


def rouge_l(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean over items of the best-reference ROUGE-L F-measure × 100 (rouge_score)."""
    from rouge_score import rouge_scorer  # optional metrics dependency, imported only when this metric runs

    _check(hypotheses, references)
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    total = sum(scorer.score_multi(list(refs), hyp)["rougeL"].fmeasure
                for hyp, refs in zip(hypotheses, references))
    return 100.0 * total / len(hypotheses)


def cider(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus CIDEr-D (pycocoevalcap), on its native 0–10 scale."""
    from pycocoevalcap.cider.cider import Cider  # optional metrics dependency, imported only when this metric runs

    gts, res = _coco_inputs(hypotheses, references)
    score, _ = Cider().compute_score(gts, res)
    return float(score)


def java_available() -> bool:
    """Whether a ``java`` executable is on PATH (METEOR needs it)."""
    return shutil.which("java") is not None


def meteor(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float | None:
    """METEOR 1.5 × 100 via pycocoevalcap's Java jar; ``None`` when Java is not installed."""
    if not java_available():
        return None
    from pycocoevalcap.meteor.meteor import Meteor  # optional metrics dependency, imported only when this metric runs

    gts, res = _coco_inputs(hypotheses, references)
    scorer = Meteor()  # starts the jar; its __del__ stops it
    score, _ = scorer.compute_score(gts, res)
    del scorer
    return 100.0 * float(score)


def success_rate(flags: Iterable[bool]) -> float:
    """Percentage of True flags (constraint satisfied)."""
    flags = [bool(f) for f in flags]
    if not flags:
        raise MetricInputError("success_rate needs at least one flag")
    return 100.0 * sum(flags) / len(flags)


def keyword_groups_covered(text: str, groups: Sequence[Sequence[str]]) -> bool:
    """True iff for every group some form occurs in ``text`` as a whole word (case-insensitive);
    e.g. groups ``[["stand", "stands", "stood"], ["field", "fields"]]``."""
    lowered = text.lower()
    for group in groups:
        if not group:
            raise MetricInputError("a keyword group is empty")
        if not any(re.search(rf"(?<![\w]){re.escape(form.lower())}(?![\w])", lowered)
                   for form in group):
            return False
    return True


def evaluate_generations(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                         satisfied: Sequence[bool] | None = None,
                         with_meteor: bool = True) -> dict[str, float | None]:
    """The experiments' metric table row: ``bleu4``, ``rouge_l``, ``cider`` (×100, as CommonGen
    tables print it), ``meteor`` (None without Java or when ``with_meteor`` is False) and
    ``success`` (% of ``satisfied``; None when not given)."""
    row: dict[str, float | None] = {
        "bleu4": bleu4(hypotheses, references),
        "rouge_l": rouge_l(hypotheses, references),
        "cider": 100.0 * cider(hypotheses, references),
        "meteor": meteor(hypotheses, references) if with_meteor else None,
        "success": success_rate(satisfied) if satisfied is not None else None,
    }
    return row
