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
returns pycocoevalcap's own score, and :func:`evaluate_generations` (and :class:`CorpusScorer`)
multiply it by :data:`CIDER_SCALE` = 10, the scale of the CommonGen paper, its leaderboard, GeLaTo
and Ctrl-G (e.g. Ctrl-G's 16.2 on test). :data:`SCALES` names each metric's scale; result files
record it.
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
from typing import Iterable, Sequence

import numpy as np

from ctrlg.errors import CtrlgError

__all__ = [
    "CIDER_SCALE",
    "SCALES",
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
    "CorpusScorer",
    "bootstrap_resamples",
    "paired_bootstrap",
    "MeteorSession",
]


# CommonGen papers print CIDEr as pycocoevalcap's score × 10 (BLEU/ROUGE/METEOR as × 100)
CIDER_SCALE = 10.0
SCALES = {"bleu4": "x100", "rouge_l": "x100 (F-measure)", "cider": "pycocoevalcap x10",
          "meteor": "x100"}


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
    """The experiments' metric table row: ``bleu4``, ``rouge_l``, ``cider`` (pycocoevalcap × 10, as
    CommonGen papers print it), ``meteor`` (None without Java or when ``with_meteor`` is False) and
    ``success`` (% of ``satisfied``; None when not given)."""
    row: dict[str, float | None] = {
        "bleu4": bleu4(hypotheses, references),
        "rouge_l": rouge_l(hypotheses, references),
        "cider": CIDER_SCALE * cider(hypotheses, references),
        "meteor": meteor(hypotheses, references) if with_meteor else None,
        "success": success_rate(satisfied) if satisfied is not None else None,
    }
    return row


# ---------------------------------------------------------------------- paired bootstrap
CORPUS_METRICS = ("bleu4", "rouge_l", "cider", "meteor")


class MeteorSession:
    """One METEOR 1.5 jar process (needs ``java``): per-item statistics once (``SCORE``), then the corpus score of
    any multiset of items from those statistics (``EVAL``), which is how the jar aggregates."""

    def __init__(self):
        from pycocoevalcap.meteor.meteor import Meteor

        self._jar = Meteor()

    def item_statistics(self, hypothesis: str, references: Sequence[str]) -> str:
        return self._jar._stat(hypothesis, list(references))

    def corpus_score(self, statistics: Sequence[str]) -> float:
        jar = self._jar
        with jar.lock:
            jar.meteor_p.stdin.write(("EVAL ||| " + " ||| ".join(statistics) + "\n").encode())
            jar.meteor_p.stdin.flush()
            for _ in statistics:  # per-item scores, not needed
                jar.meteor_p.stdout.readline()
            return 100.0 * float(jar.meteor_p.stdout.readline().strip())

    def close(self) -> None:
        del self._jar


def _bleu_item_statistics(ctest) -> np.ndarray:
    """[items, 10]: test length, closest reference length, guesses and clipped matches for
    n = 1..4 — pycocoevalcap's cooked BLEU statistics (``option="closest"``)."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    rows = []
    for comps in ctest:
        reflen = BleuScorer()._single_reflen(comps["reflen"], "closest", comps["testlen"])
        rows.append([comps["testlen"], reflen, *comps["guess"], *comps["correct"]])
    return np.asarray(rows, dtype=np.float64)


def _corpus_bleu4(totals: np.ndarray) -> float:
    """pycocoevalcap's corpus BLEU-4 from summed statistics (same ``tiny``/``small`` guards)."""
    tiny, small = 1e-15, 1e-9
    testlen, reflen, guess, correct = totals[0], totals[1], totals[2:6], totals[6:10]
    bleu = float(np.prod((correct + tiny) / (guess + small))) ** 0.25
    ratio = (testlen + tiny) / (reflen + small)
    return bleu * math.exp(1 - 1 / ratio) if ratio < 1 else bleu


class _CiderTables:
    """CIDEr-D (pycocoevalcap's ``CiderScorer``, n = 4, σ = 6) as sparse matrices over n-grams, so
    that the IDF of any resampled corpus costs a few sparse products instead of Python loops.

    With idf(g) = log N − log max(1, df(g)) ≥ 0 (df: resampled items whose references contain g),
    every quantity is linear in idf(g)²: ‖hyp‖²_n = Σ tf_h² idf², ‖ref‖²_n = Σ tf_r² idf², and the
    clipped dot product Σ min(tf_h idf, tf_r idf)·tf_r idf = Σ min(tf_h, tf_r)·tf_r·idf².
    """

    def __init__(self, ctest, crefs, sigma: float = 6.0, n: int = 4):
        from scipy import sparse

        index: dict[tuple, int] = {}
        col = lambda g: index.setdefault(g, len(index))  # noqa: E731
        presence, hyp_sq, ref_sq, dot = ([], [], []), ([], [], []), ([], [], []), ([], [], [])
        item_of_ref, penalty, num_refs = [], [], []

        def add(triple, row, column, value):
            triple[0].append(row), triple[1].append(column), triple[2].append(value)

        bigrams = lambda counts: sum(c for g, c in counts.items() if len(g) == 2)  # noqa: E731
        for i, (test, refs) in enumerate(zip(ctest, crefs)):
            for g in {g for ref in refs for g in ref}:
                add(presence, i, col(g), 1.0)
            for g, tf in test.items():
                add(hyp_sq, i * n + len(g) - 1, col(g), float(tf) ** 2)
            num_refs.append(len(refs))
            for ref in refs:
                r = len(item_of_ref)
                item_of_ref.append(i)
                penalty.append(math.exp(-float(bigrams(test) - bigrams(ref)) ** 2
                                        / (2 * sigma ** 2)))
                for g, tf in ref.items():
                    add(ref_sq, r * n + len(g) - 1, col(g), float(tf) ** 2)
                    if g in test:
                        add(dot, r * n + len(g) - 1, col(g), float(min(test[g], tf) * tf))
        G, items, R = max(len(index), 1), len(ctest), len(item_of_ref)
        csr = lambda t, rows: sparse.csr_matrix((t[2], (t[0], t[1])), shape=(rows, G))  # noqa: E731
        self.presence = csr(presence, items).T.tocsr()   # [G, items]
        self.hyp_sq, self.ref_sq, self.dot = csr(hyp_sq, items * n), csr(ref_sq, R * n), csr(dot, R * n)
        self.item_of_ref = np.asarray(item_of_ref)
        self.penalty = np.asarray(penalty)
        self.num_refs = np.asarray(num_refs, dtype=np.float64)
        self.n = n

    def item_scores(self, counts: np.ndarray) -> np.ndarray:
        """CIDEr-D of every item (native 0–10 scale) in the corpus where item i occurs counts[i]
        times; the IDF comes from that corpus's references."""
        size = float(counts.sum())
        idf = np.log(size) - np.log(np.maximum(1.0, self.presence @ counts))
        weight = idf ** 2
        norm_hyp = np.sqrt(self.hyp_sq @ weight).reshape(-1, self.n)[self.item_of_ref]
        norm_ref = np.sqrt(self.ref_sq @ weight).reshape(-1, self.n)
        value = (self.dot @ weight).reshape(-1, self.n)
        both = (norm_hyp != 0) & (norm_ref != 0)
        value = np.where(both, value / np.where(both, norm_hyp * norm_ref, 1.0), value)
        per_ref = value.mean(1) * self.penalty
        return 10.0 * np.bincount(self.item_of_ref, per_ref, len(self.num_refs)) / self.num_refs


class CorpusScorer:
    """One system's outputs, prepared so that every corpus metric can be recomputed on any
    multiset of items (a bootstrap resample) exactly as :func:`bleu4`, :func:`rouge_l`,
    :func:`cider` and :func:`meteor` would score that resampled corpus, without re-tokenising.

    Per item it keeps BLEU's statistics (pycocoevalcap's clipped n-gram matches, lengths and
    closest reference length; summed over the resample), the ROUGE-L F-measure (averaged),
    CIDEr-D's n-gram tables (:class:`_CiderTables`: the IDF is recomputed from the resampled
    references) and METEOR's sufficient statistics (aggregated by the jar). Cost per resample:
    O(items) for BLEU / ROUGE-L, a few sparse products over the n-grams for CIDEr, one ``EVAL``
    round trip to the METEOR jar.
    """

    def __init__(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                 metrics: Sequence[str] = CORPUS_METRICS, meteor_session=None):
        from pycocoevalcap.bleu.bleu_scorer import BleuScorer
        from pycocoevalcap.cider.cider_scorer import CiderScorer
        from rouge_score import rouge_scorer

        unknown = sorted(set(metrics) - set(CORPUS_METRICS))
        if unknown:
            raise MetricInputError(f"unknown metric(s) {unknown}; choose from {CORPUS_METRICS}")
        gts, res = _coco_inputs(hypotheses, references)
        self.metrics = tuple(metrics)
        self.size = len(hypotheses)
        if "bleu4" in metrics:
            bleu = BleuScorer(n=4)
            for i in range(self.size):
                bleu += (res[i][0] or "<empty>", gts[i])
            self._bleu = _bleu_item_statistics(bleu.ctest)
        if "cider" in metrics:
            cider_scorer = CiderScorer(n=4, sigma=6.0)
            for i in range(self.size):
                cider_scorer += (res[i][0], gts[i])
            self._cider = _CiderTables(cider_scorer.ctest, cider_scorer.crefs)
        if "rouge_l" in metrics:
            scorer = rouge_scorer.RougeScorer(["rougeL"])
            self._rouge = np.asarray([scorer.score_multi(list(refs), hyp)["rougeL"].fmeasure
                                      for hyp, refs in zip(hypotheses, references)])
        if "meteor" in metrics:
            if meteor_session is None:
                raise MetricInputError("METEOR needs a running jar: pass meteor_session="
                                       "MeteorSession() or leave 'meteor' out of metrics")
            self._meteor = meteor_session
            self._meteor_stats = [meteor_session.item_statistics(res[i][0], gts[i])
                                  for i in range(self.size)]

    def score(self, indices: Sequence[int]) -> dict[str, float]:
        """Every metric on the corpus made of items ``indices`` (repetitions count), on the
        scales of :func:`evaluate_generations` (CIDEr × :data:`CIDER_SCALE`)."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0 or indices.min() < 0 or indices.max() >= self.size:
            raise MetricInputError(f"indices must be a non-empty list of items in "
                                   f"[0, {self.size}), got {indices.tolist()!r:.80}")
        counts = np.bincount(indices, minlength=self.size).astype(np.float64)
        out: dict[str, float] = {}
        if "bleu4" in self.metrics:
            out["bleu4"] = 100.0 * _corpus_bleu4(counts @ self._bleu)
        if "rouge_l" in self.metrics:
            out["rouge_l"] = 100.0 * float(counts @ self._rouge) / indices.size
        if "cider" in self.metrics:
            out["cider"] = CIDER_SCALE * float(counts @ self._cider.item_scores(counts)) / indices.size
        if "meteor" in self.metrics:
            out["meteor"] = self._meteor.corpus_score([self._meteor_stats[i] for i in indices])
        return out


def bootstrap_resamples(num_items: int, num_resamples: int | str = 1000,
                        seed: int = 0) -> list[tuple[int, ...]]:
    """Item indices of each bootstrap resample: ``num_resamples`` draws of ``num_items`` items
    with replacement (numpy, ``seed``), or ``"all"``: every one of the num_items^num_items
    equally likely resamples (exact enumeration, for tiny corpora)."""
    if num_items < 1:
        raise MetricInputError("the bootstrap needs at least one item")
    if num_resamples == "all":
        if num_items > 6:
            raise MetricInputError(f"enumerating all {num_items}^{num_items} resamples is too "
                                   f"costly; use at most 6 items or a number of resamples")
        return list(itertools.product(range(num_items), repeat=num_items))
    if not isinstance(num_resamples, int) or num_resamples < 1:
        raise MetricInputError(f"num_resamples must be a positive integer or 'all', got "
                               f"{num_resamples!r}")
    rng = np.random.default_rng(seed)
    return [tuple(row) for row in rng.integers(0, num_items, size=(num_resamples, num_items))]


def paired_bootstrap(system: CorpusScorer, baseline: CorpusScorer, num_resamples: int | str = 1000,
                     seed: int = 0, confidence: float = 0.95) -> dict[str, dict[str, float]]:
    """Paired bootstrap (Koehn 2004) of ``system − baseline`` per corpus metric.

    Each resample draws items with replacement; both systems are scored on the same items and
    every corpus metric is recomputed on the resampled corpus (BLEU's clipped counts and brevity
    penalty, CIDEr's IDF, METEOR's aggregate). Returns ``{metric: {"delta": difference on the full
    corpus, "low", "high": the percentile interval at ``confidence``, "p_not_better": share of
    resamples with delta ≤ 0}}``. Cost: ``num_resamples`` × two :meth:`CorpusScorer.score`.
    """
    if system.size != baseline.size:
        raise MetricInputError(f"paired bootstrap over {system.size} and {baseline.size} items: "
                               f"both systems must be scored on the same items")
    if not 0.0 < confidence < 1.0:
        raise MetricInputError(f"confidence must be in (0, 1), got {confidence}")
    metrics = [m for m in system.metrics if m in baseline.metrics]
    full = list(range(system.size))
    first, second = system.score(full), baseline.score(full)
    deltas = {m: [] for m in metrics}
    for indices in bootstrap_resamples(system.size, num_resamples, seed):
        a, b = system.score(indices), baseline.score(indices)
        for m in metrics:
            deltas[m].append(a[m] - b[m])
    tail = 100.0 * (1.0 - confidence) / 2.0
    out = {}
    for m in metrics:
        values = np.asarray(deltas[m])
        low, high = np.percentile(values, [tail, 100.0 - tail])
        out[m] = {"delta": first[m] - second[m], "low": float(low), "high": float(high),
                  "p_not_better": float(np.mean(values <= 0.0))}
    return out
