"""Token-level deterministic finite automata: the core type, builders, boolean operations,
minimisation and the regex compiler. See :class:`ctrlg.dfa.core.TokenDFA` for the representation.
"""

from ctrlg.dfa.core import DFABuilder, TokenDFA

__all__ = ["DFABuilder", "TokenDFA"]
