"""The search options of a decoding config (``generation.*``), read once and applied to a
``model.generate`` call: which beam score the guide returns, the cheaper equivalents of
transformers' per-step work, and diverse beams (:mod:`ctrlg.lm.beam_search`).

Keys (all optional; the defaults reproduce plain beam search):

* ``fast_search`` (bool, default false here; the experiments' config turns it on): beam search
  with :class:`ctrlg.lm.beam_search.InPlaceBans` instead of transformers' no-repeat-n-gram /
  min-new-tokens processors, and :func:`ctrlg.lm.beam_search.two_stage_topk`. Same beams (the order
  among exactly equal scores aside).
* ``beam_score``: ``guided`` (default) | ``lookahead`` (:class:`ctrlg.ConstraintLogitsProcessor`:
  beams ranked by log p_lm(prefix) + w · log p_hmm(α | prefix)).
* ``sibling_penalty`` γ ≥ 0 (default 0, off): diverse beams by intra-sibling rank
  (:class:`ctrlg.lm.beam_search.SiblingRankPenalty`).
* ``score_kept_only`` (bool, default false here; the experiments' config turns it on): with beam
  search, ``beam_score: lookahead`` and no sibling penalty, the guide scores only the entries the
  search can keep (``ConstraintLogitsProcessor(keep_top=4·B)`` inside
  :func:`ctrlg.lm.beam_scores.record_beam_scores`; :mod:`ctrlg.guide.beam_candidates`): the same
  beams and scores up to float rounding, without most of the [R, h]·[h, V] products. Ignored
  otherwise (sampling and the guided score need every token's score; a sibling penalty reorders
  entries after the guide).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from ctrlg.lm.beam_scores import record_beam_scores
from ctrlg.lm.beam_search import InPlaceBans, SiblingRankPenalty, two_stage_topk
from ctrlg.errors import CtrlgError
from ctrlg.sampler import BEAM_SCORES

__all__ = ["SearchOptions", "SearchOptionError"]


class SearchOptionError(CtrlgError):
    """A ``generation.*`` search option with a value that cannot run."""


@dataclass(frozen=True)
class SearchOptions:
    beams: int = 1                 # the search's width (1: sampling)
    fast_search: bool = False
    beam_score: str = "guided"
    sibling_penalty: float = 0.0
    score_kept_only: bool = False

    @classmethod
    def from_config(cls, gen, num_beams: int, num_samples: int) -> "SearchOptions":
        """From a ``generation`` config (a mapping with ``get``); ``num_beams`` = 1 is sampling."""
        fast = gen.get("fast_search", False)
        if not isinstance(fast, bool):
            raise SearchOptionError(f"generation.fast_search must be true or false, got {fast!r}")
        kept_only = gen.get("score_kept_only", False)
        if not isinstance(kept_only, bool):
            raise SearchOptionError(f"generation.score_kept_only must be true or false, "
                                    f"got {kept_only!r}")
        score = str(gen.get("beam_score", "guided"))
        if score not in BEAM_SCORES:
            raise SearchOptionError(f"generation.beam_score must be one of {BEAM_SCORES}, got {score!r}")
        penalty = gen.get("sibling_penalty", 0.0) or 0.0
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) \
                or not math.isfinite(penalty) or penalty < 0:
            raise SearchOptionError(f"generation.sibling_penalty must be a finite number ≥ 0, "
                                    f"got {penalty!r}")
        beams = max(int(num_beams), int(num_samples)) if int(num_beams) > 1 else 1
        if penalty and beams == 1:
            raise SearchOptionError("generation.sibling_penalty > 0 needs beam search "
                                    "(generation.num_beams > 1)")
        return cls(beams, fast, score, float(penalty), kept_only)

    def bans(self, decoding: dict, extra: dict, prompt_width: int, eos: list[int]):
        """With ``fast_search`` and beams: (an :class:`InPlaceBans` taking over
        ``no_repeat_ngram_size`` from ``decoding`` — removed there — and ``min_new_tokens``
        from ``extra``, the remaining ``extra``); else (None, ``extra``)."""
        if not (self.fast_search and self.beams > 1):
            return None, extra
        ngram = int(decoding.pop("no_repeat_ngram_size", 0) or 0)
        rest = dict(extra)
        min_new = int(rest.pop("min_new_tokens", 0) or 0)
        if not ngram and not min_new:
            return None, rest
        return InPlaceBans(ngram, min_new, int(prompt_width), list(eos)), rest

    def processors(self, bans, processors: list) -> list:
        """The logits processors in order: bans first (where transformers runs its own), then
        ``processors`` (recorder, guide), then the sibling penalty (on the guided scores)."""
        out = ([bans] if bans is not None else []) + list(processors)
        if self.sibling_penalty:
            out.append(SiblingRankPenalty(self.sibling_penalty, top=self._kept()))
        return out

    def _kept(self) -> int:
        # transformers keeps max(2, 1 + #EOS) · B continuations per input; 4·B covers up to 3 EOS ids
        return 4 * self.beams

    def keep_top(self) -> int | None:
        """The guide's ``keep_top`` (:class:`ctrlg.ConstraintLogitsProcessor`): 4·B continuations
        per input (transformers keeps max(2, 1 + #EOS) · B; the processor reads the exact number
        inside :func:`record_beam_scores` and refuses one above it) where ``score_kept_only``
        applies (module docstring), else None (every entry scored)."""
        applies = self.score_kept_only and self.beams > 1 and self.beam_score == "lookahead" \
            and not self.sibling_penalty
        return self._kept() if applies else None

    @contextlib.contextmanager
    def topk(self, model):
        """The context of the ``generate`` call: :func:`two_stage_topk` with ``fast_search``, and
        the running beam scores recorded (:func:`record_beam_scores`) where :meth:`keep_top`
        applies."""
        with contextlib.ExitStack() as stack:
            if self.fast_search and self.beams > 1:
                stack.enter_context(two_stage_topk(model))
            if self.keep_top() is not None:
                stack.enter_context(record_beam_scores(model))
            yield
