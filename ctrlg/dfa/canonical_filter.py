"""Canonical encodings without the product automaton: ``L(A) ∩ Canon`` decided at decode time.

An exact canonical token DFA must remember the class of the previous token, and for loops over
large token classes that is thousands of states and millions of transitions
(:func:`ctrlg.dfa.bpe_merges.loop_transition_bound`: ≥ 4,188 states and ≥ 15.3M transitions for
a ``[a-z]+`` loop on SmolLM2), more than any compile budget or guide table can hold.
:class:`CanonicalDFA` keeps the two factors apart instead:

* ``A``, the all-encodings token DFA of the pattern (13 states for an e-mail regex), and
* ``Canon``, the canonical token sequences of the tokenizer, given by the **bigram test** of
  :mod:`ctrlg.dfa.canonical` (``[t_1]`` and every pair ``[t_i, t_{i+1}]`` canonical, with the
  whitespace flags of :class:`~ctrlg.dfa.canonical.PairChecker`),

and accepts exactly the canonical sequences A accepts — the same language as
``canonical_token_dfa`` builds, which the tests check state by state where that product fits.
The product state after a prefix is ``σ = (q, last token, its flag)``; its transitions are
computed when a decoder reaches it (:class:`ctrlg.guide.canonical_masks.CanonicalFeasibility`), so
compiling costs what the all-encodings DFA costs.

What changes for Ctrl-G: the HMM's look-ahead tables are built over ``A`` (they count every
encoding of the rest of the text, an over-estimate of the canonical ones), while the token mask
is exact for ``L(A) ∩ Canon`` under the length budget. Intersection with another token DFA keeps
the form (``(A ∩ B) ∩ Canon``); union, complement and concatenation do not distribute over the
canonical filter, and raise :class:`~ctrlg.errors.ConstraintError`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlg.dfa.canonical import FREE, NEEDS_NONSPACE, REJECT, START, pair_checker, token_verdicts
from ctrlg.dfa.core import TokenDFA, WrapsTokenDFA
from ctrlg.errors import ConstraintError

__all__ = ["CanonicalDFA", "end_allowed"]


def end_allowed(flag) -> np.ndarray | bool:
    """Whether the text may end after a token with this flag (a token that needs a non-space
    successor cannot be last)."""
    return np.asarray(flag) != NEEDS_NONSPACE


class CanonicalDFA(WrapsTokenDFA):
    """The canonical token sequences accepted by the token DFA ``dfa`` (module docstring).

    Args:
        dfa: the all-encodings automaton A (any :class:`TokenDFA`).
        tokenizer: the byte-level BPE tokenizer (or its :class:`~ctrlg.Vocabulary`) whose
            canonical encodings are kept.
        eos_token_ids: EOS ids A accepts after a full match (not part of the text).
        what: the pattern, for messages.
    """

    def __init__(self, dfa: TokenDFA, tokenizer, *, eos_token_ids: Sequence[int] = (),
                 what: str = "constraint"):
        if not isinstance(dfa, TokenDFA):
            raise ConstraintError(f"CanonicalDFA needs a TokenDFA, got {type(dfa).__name__}")
        self.dfa = dfa
        self.tokenizer = tokenizer
        self.checker = pair_checker(tokenizer)
        if len(self.checker.tokens) > dfa.vocab_size:
            raise ConstraintError(f"the tokenizer has {len(self.checker.tokens)} tokens but the "
                                  f"DFA's vocabulary has {dfa.vocab_size}")
        self.eos_token_ids = tuple(int(e) for e in eos_token_ids)
        self.what = what

    def with_dfa(self, dfa: TokenDFA) -> "CanonicalDFA":
        """The same canonical filter over another all-encodings automaton (e.g. A ∩ B)."""
        return CanonicalDFA(dfa, self.tokenizer, eos_token_ids=self.eos_token_ids, what=self.what)

    # -- membership -------------------------------------------------------------------
    def path_flags(self, tokens: Sequence[int]) -> list[int]:
        """The flag of each token of ``tokens`` (no EOS) under the bigram test; stops at the
        first REJECT (the list is then shorter than ``tokens`` or ends with REJECT)."""
        last, flag, flags = START, FREE, []
        for t in tokens:
            flag = int(token_verdicts(self.checker, last, flag, int(t)))
            flags.append(flag)
            if flag == REJECT:
                break
            last = int(t)
        return flags

    def is_canonical_text(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (no EOS) pass the bigram test and may end the text."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            return True
        flags = self.path_flags(tokens)
        return len(flags) == len(tokens) and flags[-1] != REJECT and bool(end_allowed(flags[-1]))

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether A accepts ``tokens`` and their text part (before the first EOS) is canonical."""
        tokens = [int(t) for t in tokens]
        if not self.dfa.accepts(tokens):
            return False
        eos = set(self.eos_token_ids)
        cut = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        return self.is_canonical_text(tokens[:cut])

    def __repr__(self) -> str:
        return f"CanonicalDFA({self.what}; all-encodings factor {self.dfa!r})"
