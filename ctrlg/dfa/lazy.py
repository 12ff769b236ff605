"""A lazy token automaton: regex → byte NFA, with DFA states and token masks built on first use.

The eager path (:func:`ctrlg.dfa.regex`) determinises the whole byte automaton, computes every
state's token transitions and minimises; a JSON schema of a few kilobytes pays tens to hundreds
of milliseconds before the first token. Logical masking needs none of that up front: it needs the
mask of the states a generation actually visits. :func:`lazy_regex` therefore stops at the
Thompson ε-NFA (:class:`~ctrlg.dfa.bytes_dfa.ByteNFA`) and builds, on demand:

* **byte-DFA rows** (:class:`LazyByteDFA`): subset construction (Rabin–Scott) one state at a
  time, ``row(q)[b] = closure(move(q, b))``. NFA states from which the accepting state cannot be
  reached are removed first (backward search over the NFA; for the NFA built on demand, the
  sub-expressions of empty language are pruned from the AST instead,
  :func:`~ctrlg.dfa.lazy_nfa.prune_empty`), so every non-empty subset is *live* and the dead
  state is exactly the empty set (id 0): no liveness pass over the DFA is needed.
* **token masks** (:meth:`LazyTokenDFA.mask`): ``mask_q[v] = [δ*(q, bytes(v)) ≠ dead]``, by an
  iterative depth-first walk of the vocabulary's byte trie (flat CSR arrays,
  :class:`~ctrlg.dfa.vocab_trie.VocabTrie`) over the byte rows, compiled with numba
  (:func:`_walk`). A branch is cut as soon as the byte DFA dies, so the cost is the number of
  live (trie node, state) pairs. A walk that meets a state whose row is not built yet records
  the (node, state) pair and skips the branch; the rows are built and the walk resumed from
  those pairs (each trie node is visited once per state in all). A child entered in a state
  whose loop bytes (below) cover every byte of its subtrie is not descended: the trie's nodes are
  in pre-order, so its tokens are one contiguous range, all leading back to that state
  (*loop subtries*, :func:`_subtrees`).
* **loop slices** (:func:`loop_slice`): a state ``q`` whose *loop bytes* ``L = {b : δ(q, b) = q}``
  admit many tokens (the body of a JSON string) maps every token spelled by bytes of ``L`` alone to
  itself. Those tokens, and the trie edges that leave them (by a byte outside ``L``), are found
  once per (vocabulary, ``L``) and shared by every state, pattern and schema with the same loop;
  the walk then starts from the exits only.

The language is exactly :func:`ctrlg.dfa.regex`'s with ``encodings="all"``:
``L_tok = {t_1..t_n (EOS)* : bytes(t_1)···bytes(t_n) ∈ L(pattern)}``; EOS (``eos_token_id``)
goes from an accepting state to :data:`ENDED` (accepting, EOS loops), tokens without bytes are
dead everywhere, and an EOS token with bytes is only EOS. States are the lazy byte DFA's ids (0
dead, :data:`ENDED` = 1), so two runs number states differently than the eager DFA: compare
languages or masks, not ids. :meth:`LazyTokenDFA.materialize` builds an eager
:class:`~ctrlg.dfa.core.TokenDFA` of the states reachable within a token budget (what the Ctrl-G
guide's tables need).

Costs: compile = the regex parse (repeated groups parsed once) and the Thompson NFA's initial
ε-closure: the NFA is built on demand too (:mod:`ctrlg.dfa.lazy_nfa`), a fragment when the
subset construction first reaches its start state; a state's first mask = its row(s) (Python,
per new byte state, with the NFA states they reach) + the trie walk (compiled); later masks are
a dict look-up (memoised, read-only arrays).
"""

from __future__ import annotations

import bisect
import operator
import weakref
from typing import NamedTuple

import numpy as np

from ctrlg.dfa.bytes_dfa import ByteDFA, ByteNFA
from ctrlg.dfa.core import TokenDFA, ragged_indices
from ctrlg.dfa.regex_index import AUTO, resolve_eos, resolve_vocab_size, token_dfa_from_bytes_dfa
from ctrlg.dfa.regex_syntax import Alternation, CharSet, Node, Repeat, _Parser, surrogate_hint
from ctrlg.dfa.template_nfa import MAX_LAZY_NFA_STATES, TemplateNFA, _item_class
from ctrlg.dfa.lazy_nfa import lazy_thompson
from ctrlg.dfa.vocab_trie import VocabTrie, _subtrie, vocab_trie
from ctrlg.errors import ConstraintError, RegexError, UnsatisfiableConstraintError

__all__ = ["TemplateNFA", "LazyByteDFA", "LazyTokenDFA", "lazy_regex", "loop_slice", "class_slice",
           "ClassSlice", "DEAD", "ENDED",
           "MAX_LAZY_STATES"]

DEAD = 0
ENDED = 1
#: the lazy byte DFA refuses to grow past this many states (RegexError)
MAX_LAZY_STATES = 2_000_000
#: a loop byte set is sliced (its tokens found once per vocabulary) when it spells at least
#: this fraction of the vocabulary
SLICE_MIN_FRACTION = 1 / 16
#: loop slices and class slices kept per vocabulary at most, and memoised masks (V bytes each)
#: per class slice (a serving process meets schema after schema: its caches stay bounded)
MAX_CACHED_SLICES = 128
MAX_MASKS_PER_SLICE = 32
_STACK_PER_DEPTH = 256


# ---------------------------------------------------------------------- parsing, with shared groups
#: parsed non-capturing groups kept across patterns, keyed by their text
_GROUPS: dict[str, Node] = {}
_MAX_GROUPS = 20_000
_MAX_GROUP_CHARS = 4_000


class _SharedGroupParser(_Parser):
    """:mod:`ctrlg.dfa.regex_syntax`'s parser, except that a non-capturing group ``(?:…)``
    whose text (up to its matching parenthesis, found by one scan of the pattern) was parsed
    before — in this pattern or, when short, an earlier one — is not parsed again: a schema's
    regex repeats the same pieces (a string's character, whitespace, a number) thousands of
    times, and an inlined ``$ref`` definition as often as it is referred to. The AST is
    immutable, so sharing it is exact; any other construct goes to the parser unchanged."""

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self._close = _matching_parens(pattern)
        self._local: dict[str, Node] = {}    # longer groups, kept for this pattern only

    def group(self):
        i = self.i
        end = self._close.get(i) if self._close is not None else None
        if end is None or not self.p.startswith("(?:", i):
            return super().group()
        key = self.p[i:end + 1]
        groups = _GROUPS if end - i <= _MAX_GROUP_CHARS else self._local
        node = groups.get(key)
        if node is None:
            node = super().group()
            if self.i != end + 1:      # the scan disagrees with the parser: do not keep it
                return node
            if len(groups) >= _MAX_GROUPS and groups is _GROUPS:
                _GROUPS.clear()
            groups[key] = node
            return node
        self.i = end + 1
        return node


def _matching_parens_py(p: str) -> dict[int, int] | None:
    """``{index of '(' : index of its ')'}`` outside character classes and escapes, or None
    when the pattern's parentheses do not balance (the parser then reports the error). The
    reference for :func:`_paren_pairs` (a compiled scan of the same rules)."""
    out: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":                     # a class: ']' right after '[' or '[^' is literal
            j = i + 1
            if j < n and p[j] == "^":
                j += 1
            if j < n and p[j] == "]":
                j += 1
            while j < n and p[j] != "]":
                j += 2 if p[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            stack.append(i)
        elif c == ")":
            if not stack:
                return None
            out[stack.pop()] = i
        i += 1
    return out if not stack else None


def _paren_pairs_py(code, opens, closes):
    """:func:`_matching_parens_py` over the pattern's code points (``code``, int array): fills
    ``opens[k]``/``closes[k]`` and returns the number of pairs, or -1 when unbalanced."""
    n = code.shape[0]
    stack = np.empty(n + 1, dtype=np.int64)
    sp = 0
    k = 0
    i = 0
    while i < n:
        c = code[i]
        if c == 92:                       # backslash
            i += 2
            continue
        if c == 91:                       # '['
            j = i + 1
            if j < n and code[j] == 94:   # '^'
                j += 1
            if j < n and code[j] == 93:   # ']'
                j += 1
            while j < n and code[j] != 93:
                j += 2 if code[j] == 92 else 1
            i = j + 1
            continue
        if c == 40:                       # '('
            stack[sp] = i
            sp += 1
        elif c == 41:                     # ')'
            if sp == 0:
                return -1
            sp -= 1
            opens[k] = stack[sp]
            closes[k] = i
            k += 1
        i += 1
    return k if sp == 0 else -1


try:
    import numba as _nb
    _paren_pairs = _nb.njit(cache=True, nogil=True)(_paren_pairs_py)
except ImportError:  # pragma: no cover - numba is a dependency
    _paren_pairs = None


#: patterns at least this long are scanned by the compiled loop (its first call in a process
#: loads it from numba's cache, ~20 ms: the Python scan of 100,000 characters takes ~15 ms);
#: so are the patterns of at least ``_SMALL_SCAN_CHARS`` once the process has scanned that many
#: characters in Python in all (the load has then paid for itself), or once it is loaded
_COMPILED_SCAN_CHARS = 100_000
_SMALL_SCAN_CHARS = 256
_python_scanned = [0]


def _matching_parens(p: str) -> dict[int, int] | None:
    """:func:`_matching_parens_py`, by the compiled scan :func:`_paren_pairs` for a pattern of
    hundreds of thousands of characters, and for any but the shortest once the Python scans of
    this process have read as many characters (a serving process, schema after schema)."""
    if _paren_pairs is None or len(p) < _SMALL_SCAN_CHARS or (
            len(p) < _COMPILED_SCAN_CHARS and _python_scanned[0] < _COMPILED_SCAN_CHARS
            and not _paren_pairs.signatures):
        _python_scanned[0] += len(p)
        return _matching_parens_py(p)
    code = np.frombuffer(p.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    opens = np.empty(len(p) // 2 + 1, dtype=np.int64)
    closes = np.empty_like(opens)
    k = _paren_pairs(code, opens, closes)
    if k < 0:
        return None
    return dict(zip(opens[:k].tolist(), closes[:k].tolist()))


def parse(pattern: str) -> Node:
    """:func:`ctrlg.dfa.regex_syntax.parse` (no anchors kept), sharing parsed groups across
    patterns (:class:`_SharedGroupParser`)."""
    if not isinstance(pattern, str):
        raise RegexError(f"regex pattern must be a str, got {type(pattern).__name__}")
    if pattern == "":
        raise RegexError("regex pattern is empty")
    return _SharedGroupParser(pattern).parse()


class LazyByteDFA:
    """The subset construction of a byte ε-NFA, one row at a time (module docstring).

    Attributes:
        table: int32 [capacity, 256]; ``table[q]`` is valid where ``computed[q]``.
        computed: bool [capacity].
        accepting: bool [capacity] (valid for every interned state).
        initial: the initial state (1 is reserved for the token automaton's ENDED state).
    """

    #: what the error at :data:`MAX_LAZY_STATES` states advises (a builder may set its own)
    too_large_hint = ""

    def __init__(self, nfa: ByteNFA, start: int, accept: int):
        n = len(nfa.edges)
        if getattr(nfa, "has_empty", True):
            if hasattr(nfa, "resolve_all"):
                nfa.resolve_all()
            self._live = _nfa_live(nfa, accept, n)
            live = self._live
            # per NFA state: its edges into live states; ε-closures over live states (memo)
            edges = [[e for e in es if live[e[2]]] for es in nfa.edges]
            self._edges_of, self._eps_of = edges.__getitem__, nfa.eps.__getitem__
        else:   # Thompson's fragments of non-empty languages: every state reaches acceptance
            self._live = None                        # (the NFA may grow: lazy_nfa)
            self._edges_of, self._eps_of = nfa.edges_of, nfa.eps_of
        self._accept = accept
        #: NFA state -> counted-slice notes (:attr:`TemplateNFA.counted`), or None
        self.notes_of = getattr(nfa, "notes_of", None)
        # masks by translation (:meth:`LazyTokenDFA._translated_mask`): for Thompson fragments of
        # non-empty languages (no liveness filter to commute with)
        # (an NFA built on demand, :mod:`ctrlg.dfa.lazy_nfa`, adds its regions as it grows)
        grows = getattr(nfa, "grows_on_demand", False)
        self._nfa = nfa if (getattr(nfa, "regions", None) or grows) \
            and not getattr(nfa, "has_empty", True) else None
        #: translated rows (:meth:`_translated_row`): translation key -> row base; the
        #: translation key of each state looked up so far; class depths and one-character
        #: steps (:meth:`class_depth`), per class
        self._row_bases: dict = {}
        self._keys: dict = {}
        self._depths: dict = {}
        self._class_steps: dict = {}
        #: rows built by translation (a count, for profiling and tests)
        self.translated_rows = 0
        # NFA state subsets are sorted tuples of ints: hashable, and untracked by the garbage
        # collector after its first pass (frozensets stay tracked, and every collection walks
        # their elements: with thousands of large subsets alive, a young-generation collection
        # cost ~70 µs and an older one ~0.5 ms, inside the masks that triggered them)
        self._closure: dict[int, tuple] = {}
        self._index: dict[tuple, int] = {}
        self._sets: list[tuple] = []
        self._move: dict[tuple, int] = {}
        cap = 64
        self.table = np.zeros((cap, 256), dtype=np.int32)
        self.computed = np.zeros(cap, dtype=np.bool_)
        self.accepting = np.zeros(cap, dtype=np.bool_)
        self._intern(())                             # 0: dead
        self._intern((-1,))                          # 1: reserved (ENDED of the token DFA)
        self.computed[DEAD] = self.computed[ENDED] = True
        init = self._closure_of([start]) if self._live is None or self._live[start] \
            else ()
        self.initial = self._intern(init) if init else DEAD

    @classmethod
    def complete(cls, dfa: ByteDFA) -> "LazyByteDFA":
        """A lazy byte DFA whose rows are all known: ``dfa``'s, renumbered (its live state d is
        d + 1 here, since 1 is reserved; states that cannot reach acceptance become the dead
        state 0, as the subset construction's empty set). Nothing is determinised on first
        use, so a state's first mask is the trie walk alone — for an automaton already
        determinised and minimised (a regular grammar's, :func:`ctrlg.dfa.lazy_grammar`), whose
        subset construction over an NFA copy of itself would only rebuild it row by row in
        Python, inside the first masks. O(Q · 256) numpy work."""
        live = dfa.live()
        live[0] = False
        Q = dfa.num_states
        ids = np.where(live, np.arange(Q, dtype=np.int64) + 1, DEAD).astype(np.int32)
        self = cls.__new__(cls)
        self._live, self._accept, self.notes_of, self._nfa = None, -2, None, None
        self._edges_of = self._eps_of = lambda s: ()     # no NFA: every row is computed
        self._row_bases, self._keys, self._depths, self._class_steps = {}, {}, {}, {}
        self.translated_rows = 0
        self._closure, self._move = {}, {}
        self._sets = [(), (-1,)] + [(d,) for d in range(1, Q)]
        self._index = {subset: q for q, subset in enumerate(self._sets)}
        self.table = np.zeros((Q + 1, 256), dtype=np.int32)
        self.table[2:] = np.where(live[1:, None], ids[dfa.table[1:]], DEAD)
        self.computed = np.ones(Q + 1, dtype=np.bool_)
        self.accepting = np.zeros(Q + 1, dtype=np.bool_)
        self.accepting[2:] = dfa.accepting[1:] & live[1:]
        self.initial = int(ids[dfa.initial])
        return self

    @property
    def num_states(self) -> int:
        """States interned so far (dead and the reserved id included)."""
        return len(self._sets)

    def _closure_of(self, states) -> tuple:
        """The ε-closure of a set of NFA states: the union of their memoised closures."""
        memo = self._closure
        if len(states) == 1:
            (s,) = states
            c = memo.get(s)
            return c if c is not None else self._closure_of_state(s)
        out: set = set()
        for s in states:
            c = memo.get(s)
            out.update(c if c is not None else self._closure_of_state(s))
        return tuple(sorted(out))

    def _closure_of_state(self, s: int) -> tuple:
        """ε-closure of one NFA state by depth-first search; a state met whose closure is
        already memoised contributes that closure whole, without being searched again
        (closures are transitive: ``u ∈ closure(t)`` ⇒ ``closure(u) ⊆ closure(t)``)."""
        live, eps_of, memo = self._live, self._eps_of, self._closure
        seen = {s}
        stack = [s]
        while stack:
            for t in eps_of(stack.pop()):
                if t not in seen and (live is None or live[t]):
                    c = memo.get(t)
                    if c is None:
                        seen.add(t)
                        stack.append(t)
                    else:
                        seen.update(c)
        c = memo[s] = tuple(sorted(seen))
        return c

    def _intern(self, subset: tuple) -> int:
        q = self._index.get(subset)
        if q is None:
            q = len(self._sets)
            if q >= MAX_LAZY_STATES:
                raise RegexError(f"the lazy byte DFA exceeds {MAX_LAZY_STATES:,} states"
                                 + (f" ({self.too_large_hint})" if self.too_large_hint else ""))
            if q >= len(self.computed):
                self._grow(2 * q)
            self._index[subset] = q
            self._sets.append(subset)
            self.accepting[q] = self._accept in subset
        return q

    def _grow(self, cap: int) -> None:
        table = np.zeros((cap, 256), dtype=np.int32)     # calloc: the new rows cost no copy
        table[:len(self.table)] = self.table
        self.table = table
        self.computed = np.concatenate([self.computed,
                                        np.zeros(cap - len(self.computed), dtype=np.bool_)])
        self.accepting = np.concatenate([self.accepting,
                                         np.zeros(cap - len(self.accepting), dtype=np.bool_)])

    def row(self, q: int) -> np.ndarray:
        """``table[q]``, built on first use: for every maximal byte interval on which the same
        NFA edges fire, the ε-closure of their targets (memoised by target set)."""
        if not self.computed[q]:
            self._build_row(q)
        return self.table[q]

    def run_bytes(self, q: int, data: bytes) -> int:
        """``δ*(q, data)``: by the rows where they are built, else by the subset construction's
        step ``closure(move(S, b))`` for that byte only (the subsets met are interned, no row is
        built: a token's bytes need one transition per state, a row all 256)."""
        table, computed = self.table, self.computed
        for byte in data:
            if computed[q]:
                q = int(table[q, byte])
            else:
                M = tuple(sorted({t for s in self._sets[q] for lo, hi, t in self._edges_of(s)
                                  if lo <= byte <= hi}))
                if not M:
                    return DEAD
                r = self._move.get(M)
                if r is None:
                    r = self._move[M] = self._intern(self._closure_of(M))
                    table, computed = self.table, self.computed     # may have grown
                q = r
            if q == DEAD:
                return DEAD
        return q

    def build_rows(self, states) -> None:
        for q in states:
            if not self.computed[q]:
                self._build_row(int(q))

    def _build_row(self, q: int) -> None:
        """``row(q)``: translated from an earlier copy's row inside a counter
        (:meth:`_translated_row`), else by the subset construction (:meth:`_subset_row`)."""
        if self._nfa is not None and self._nfa.regions:
            if self._translated_row(q):
                return
            self._subset_row(q)
            self._note_row_base(q)
        else:
            self._subset_row(q)

    # ---------------------------------------------------------------- rows by translation
    def translation_key(self, q: int):
        """``(key, c)`` of state ``q`` when its NFA subset meets exactly one counted region
        (:attr:`TemplateNFA.regions`), else None: ``c`` is the lowest copy index of the
        subset's region states and ``key = (k, inside, outside)`` the subset with those moved
        back by ``c`` copies (region ``k``'s states, relative to its start) and the others, so
        two states with the same key differ by a translation ``σ^i`` (``i`` the difference of
        their ``c``). Memoised per state while no region is added (an NFA built on demand adds
        regions as it grows, and a state met before its region was added is looked at again)."""
        nfa = self._nfa
        regions, region_los = nfa.regions, nfa.region_los
        memo = self._keys.get(q)
        if memo is not None and (memo[0] is not None or memo[1] == len(regions)):
            return memo[0]
        S = self._sets[q]
        got = None
        if len(S) <= _MAX_TRANSLATED_SUBSET:     # larger: not a position inside a counter
            k = -1
            for y in S:
                j = bisect.bisect_right(region_los, y) - 1
                if j >= 0 and y < regions[j][1]:
                    if k >= 0 and j != k:
                        k = -2
                        break
                    k = j
            if k >= 0:
                lo, hi, d = regions[k]
                inside = [y - lo for y in S if lo <= y < hi]
                c = inside[0] // d                 # S is sorted
                got = ((k, tuple([x - c * d for x in inside]),
                        tuple([y for y in S if not lo <= y < hi])), c)
        self._keys[q] = (got, len(regions))
        return got

    def _translated_row(self, q: int) -> bool:
        """Build ``row(q)`` as the row of an earlier state ``p`` moved by ``σ^i``
        (``S_q = σ^i(S_p)``: the same translation key, ``i > 0``), when ``i`` is at most
        ``p``'s run (:meth:`_note_row_base`); False (nothing built) otherwise. Exact: every
        NFA state ``y`` of ``S_p`` and of every target subset ``T = row(p)[b]`` has
        ``edges(σ^j y) = σ(edges(σ^{j-1} y))`` and the same for ε-moves, ``j = 1..i``
        (:meth:`TemplateNFA.run_of`), so ``move(S_q, b) = σ^i(move(S_p, b))`` and the
        ε-closure of ``σ^i(M)`` is ``σ^i`` of that of ``M``: ``row(q)[b] = σ^i(T)``, the same
        subsets the subset construction would intern."""
        key = self.translation_key(q)
        if key is None:
            return False
        base = self._row_bases.get(key[0])
        if base is None:
            return False
        p, c0, run, parts, inverse = base
        i = key[1] - c0
        if not 0 < i <= run:
            return False
        shift = i * self._nfa.regions[key[0][0]][2]
        ids = [self._intern(tuple(sorted([x + shift for x in inside] + outside)))
               if inside is not None else DEAD for inside, outside in parts]
        self.table[q] = np.asarray(ids, dtype=np.int32)[inverse]
        self.computed[q] = True
        self.translated_rows += 1
        return True

    def _note_row_base(self, q: int) -> None:
        """Keep ``q`` (whose row was just built by the subset construction) as the base of
        later rows of its translation key, with its *run*: the least
        :meth:`TemplateNFA.run_of` over the NFA states of ``S_q`` and of its row's targets
        (kept when it reaches further than the current base's)."""
        key = self.translation_key(q)
        if key is None:
            return
        (k, *_), c = key
        old = self._row_bases.get(key[0])
        if old is not None and old[2] - (c - old[1]) > 0:
            return
        nfa = self._nfa
        lo, hi, _ = nfa.regions[k]
        run = MAX_LAZY_NFA_STATES
        for y in self._sets[q]:
            run = min(run, nfa.run_of(k, y))
            if run == 0:
                return
        uniq, inverse = np.unique(self.table[q], return_inverse=True)
        parts = []
        for t in uniq.tolist():
            if t == DEAD:
                parts.append((None, None))
                continue
            T = self._sets[t]
            for y in T:
                run = min(run, nfa.run_of(k, y))
                if run == 0:
                    return
            parts.append(([y for y in T if lo <= y < hi], [y for y in T if not lo <= y < hi]))
        if old is None or old[2] - (c - old[1]) < run:
            self._row_bases[key[0]] = (q, c, run, parts, inverse.astype(np.int64))

    # ---------------------------------------------------------------- class depth
    def class_depth(self, q: int, cls: CharSet, cap: int):
        """An upper bound ``D`` on the *need* (characters started, :class:`ClassSlice`) of
        the strings of ``Pref(C*)`` that state ``q`` can read, when one ``≤ cap`` is found,
        else None: every string of ``Pref(C*)`` of need greater than ``D`` is dead from ``q``.

        By induction over the union of the NFA states a complete character of ``C`` can
        lead to: ``D(X) = 0`` when no state of ``X`` reads a first byte of a character of
        ``C``, else ``1 + D(R(X))`` with ``R(X)`` the ε-closure of every NFA state reached
        from ``X`` by the bytes of one complete character of ``C`` (all characters at once:
        the product with ``C``'s one-character byte DFA, :func:`_class_runs`). A string of
        need ``> D(X)`` starts with a whole character (then its rest, of need ``> D(R(X))``,
        must be read from a state of ``R(X)``) or is a cut first character (only when
        ``D(X) = 0``, which reads none). ``R`` is computed over all edges (a superset of the
        live ones), so the bound is sound. Memoised per NFA subset and class."""
        memo = self._depths.setdefault(cls.ranges, {})   # exact D, or -(L+1): D > L
        per_state = self._class_steps.setdefault(cls.ranges, {})
        runs = _class_runs(cls)
        chain: list = []       # X_0 = S_q, X_1 = R(X_0), ...: each reads a first byte
        X = self._sets[q]
        while True:
            got = memo.get(X)
            if got is not None and got >= 0:
                base = got
                break
            low = -1 if got is None else -got - 1        # D(X) > low
            if len(chain) + low >= cap or len(chain) > cap:   # D(S_q) > cap
                n = len(chain)
                for i, Y in enumerate(chain):
                    bound = n - i + low                   # D(Y) > bound
                    if memo.get(Y, -1) < 0 and -memo.get(Y, -1) - 1 < bound:
                        memo[Y] = -(bound + 1)
                return None
            reads, R = False, set()
            for y in X:          # paths from the states of X are independent: R is a union
                got_y = per_state.get(y)
                if got_y is None:
                    got_y = per_state[y] = self._class_step(y, runs)
                reads |= got_y[0]
                R.update(got_y[1])
            if not reads:
                memo[X] = base = 0
                break
            chain.append(X)
            X = tuple(sorted(R))
        for Y in reversed(chain):
            base += 1
            memo[Y] = base
        return base if base <= cap else None

    def _class_step(self, y: int, runs) -> tuple:
        """``(reads, R)``: whether NFA state ``y`` has an edge on a first byte of a character
        of ``C``, and the ε-closure of the NFA states reached from ``y`` by the bytes of one
        complete character of ``C`` (:meth:`class_depth`)."""
        init, nexts, accepting, _ = runs
        out: set = set()
        cur = {init: (y,)}
        reads = False
        first = True
        while cur:
            nxt: dict = {}
            for x, P in cur.items():
                step = nexts[x]
                for z in P:
                    for lo, hi, t in self._edges_of(z):
                        got = step.get((lo, hi))
                        if got is None:
                            got = step[(lo, hi)] = _class_targets(runs, x, lo, hi)
                        for x2 in got:
                            nxt.setdefault(x2, set()).add(t)
            if first:
                reads = bool(nxt)
                first = False
            cur = {}
            for x2, T in nxt.items():
                C = self._closure_of(T)
                if accepting[x2]:
                    out.update(C)
                else:
                    cur[x2] = C
        return reads, tuple(sorted(out))

    def _subset_row(self, q: int) -> None:
        """``row(q)``: the NFA edges of ``q``'s subset grouped by byte range; when the ranges
        are disjoint (the usual case) each range's targets are one transition, else the bytes
        are cut at every range boundary and each piece gets the targets of the ranges covering
        it (a sweep over the sorted ranges)."""
        by_range: dict = {}
        edges_of = self._edges_of
        for s in self._sets[q]:
            for lo, hi, t in edges_of(s):
                got = by_range.get((lo, hi))
                if got is None:
                    by_range[(lo, hi)] = {t}
                else:
                    got.add(t)
        row = self.table[q]
        row[:] = 0
        if by_range:
            ranges = sorted(by_range)
            disjoint = all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
            if disjoint:
                pieces = [(lo, hi + 1, by_range[(lo, hi)]) for lo, hi in ranges]
            else:
                cuts = sorted({lo for lo, _ in ranges} | {hi + 1 for _, hi in ranges})
                at = {c: i for i, c in enumerate(cuts)}
                cover: list = [None] * (len(cuts) - 1)
                for lo, hi in ranges:
                    ts = by_range[(lo, hi)]
                    for i in range(at[lo], at[hi + 1]):
                        if cover[i] is None:
                            cover[i] = set(ts)
                        else:
                            cover[i] |= ts
                pieces = [(cuts[i], cuts[i + 1], ts) for i, ts in enumerate(cover) if ts]
            move, intern, closure = self._move, self._intern, self._closure_of
            for a, b, ts in pieces:
                targets = tuple(sorted(ts))
                r = move.get(targets)
                if r is None:
                    r = move[targets] = intern(closure(targets))
                    row = self.table[q]                     # the table may have grown
                row[a:b] = r
        self.computed[q] = True


def _nfa_live(nfa: ByteNFA, accept: int, n: int) -> np.ndarray:
    """Bool [n]: NFA states from which ``accept`` is reachable (backward search)."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for s in range(n):
        for _, _, t in nfa.edges[s]:
            preds[t].append(s)
        for t in nfa.eps[s]:
            preds[t].append(s)
    live = np.zeros(n, dtype=bool)
    live[accept] = True
    stack = [accept]
    while stack:
        x = stack.pop()
        for p in preds[x]:
            if not live[p]:
                live[p] = True
                stack.append(p)
    return live


# ---------------------------------------------------------------------- the trie walk (numba)
def _walk_py(table, computed, child_ptr, child_byte, child_node, tok_ptr, node_tokens,
             seed_node, seed_state, record_seeds, out_tok, out_next, n, miss_node, miss_state,
             prune, limit, stamp, stamp_id, sub_end, sub_bytes, loop_bits, loop_known):
    """Depth-first walk of the trie from ``(seed_node[i], seed_state[i])`` pairs (tokens ending
    at the seed nodes recorded too when ``record_seeds``): every token reached with a live state
    is appended to ``out_tok``/``out_next`` from index ``n``. A pair whose state has no row yet
    (``computed`` false) is not descended but appended to ``miss_node``/``miss_state``, to be
    resumed from once its row is built. Returns ``(tokens written in all, pairs missed)``; more
    missed pairs than the buffers hold returns their capacity + 1. A child node ``c`` with
    ``prune[c] <= limit`` is not entered (its subtrie's tokens are known allowed: a counted
    slice, :func:`class_slice`). Every state popped is stamped (``stamp[s] = stamp_id``).

    **Loop subtries.** A child ``c`` entered in a built state ``s`` whose subtrie spells only
    bytes of ``s``'s loop set (``sub_bytes[c] ⊆ loop_bits[s]``: every byte below ``c`` leads
    ``s`` back to ``s``) is not descended: its tokens, the contiguous pre-order range
    ``node_tokens[tok_ptr[c + 1]:tok_ptr[sub_end[c]]]``, all go to ``s`` (:func:`_trie_subtrees`).
    ``loop_bits[s]`` (256 bits as four int64) is computed from ``s``'s row on first use
    (``loop_known[s]``)."""
    nseed = seed_node.shape[0]
    cap = nseed + _STACK_PER_DEPTH * 64
    stack_node = np.empty(cap, dtype=np.int64)
    stack_state = np.empty(cap, dtype=np.int64)
    sp = 0
    m = 0
    mcap = miss_node.shape[0]
    for i in range(nseed):
        c = seed_node[i]
        s = seed_state[i]
        if record_seeds:
            for k in range(tok_ptr[c], tok_ptr[c + 1]):
                out_tok[n] = node_tokens[k]
                out_next[n] = s
                n += 1
        stack_node[sp] = c
        stack_state[sp] = s
        sp += 1
    while sp > 0:
        sp -= 1
        node = stack_node[sp]
        s = stack_state[sp]
        stamp[s] = stamp_id
        if child_ptr[node] == child_ptr[node + 1]:
            continue
        if not computed[s]:
            if m < mcap:
                miss_node[m] = node
                miss_state[m] = s
                m += 1
            else:
                return n, mcap + 1
            continue
        for e in range(child_ptr[node], child_ptr[node + 1]):
            c = child_node[e]
            if limit >= 0 and prune[c] <= limit:     # no counted slice: prune is not read
                continue
            s2 = table[s, child_byte[e]]
            if s2 == 0:
                continue
            for k in range(tok_ptr[c], tok_ptr[c + 1]):
                out_tok[n] = node_tokens[k]
                out_next[n] = s2
                n += 1
            if sub_end[c] > c + 1 and computed[s2]:
                if not loop_known[s2]:
                    for w in range(4):
                        loop_bits[s2, w] = 0
                    for b in range(256):
                        if table[s2, b] == s2:
                            loop_bits[s2, b >> 6] |= np.int64(1) << (b & 63)
                    loop_known[s2] = 1
                if ((sub_bytes[c, 0] & ~loop_bits[s2, 0]) | (sub_bytes[c, 1] & ~loop_bits[s2, 1])
                        | (sub_bytes[c, 2] & ~loop_bits[s2, 2])
                        | (sub_bytes[c, 3] & ~loop_bits[s2, 3])) == 0:
                    for k in range(tok_ptr[c + 1], tok_ptr[sub_end[c]]):
                        out_tok[n] = node_tokens[k]
                        out_next[n] = s2
                        n += 1
                    stamp[s2] = stamp_id
                    continue
            if sp >= cap:          # deeper than 64 bytes with wide branching: grow the stack
                bigger_n = np.empty(2 * cap, dtype=np.int64)
                bigger_s = np.empty(2 * cap, dtype=np.int64)
                bigger_n[:cap] = stack_node
                bigger_s[:cap] = stack_state
                stack_node, stack_state, cap = bigger_n, bigger_s, 2 * cap
            stack_node[sp] = c
            stack_state[sp] = s2
            sp += 1
    return n, m


def _subtrees_py(child_ptr, child_byte, child_node):
    """``(sub_end, sub_bytes, preorder)`` of a trie: ``sub_end[n]`` one past the last node of
    ``n``'s subtrie and ``sub_bytes[n]`` the bytes on the edges below ``n`` (256 bits as four
    int64), bottom-up (children have larger ids); ``preorder`` is false unless every subtrie is
    the contiguous id range ``[n, sub_end[n])`` (first child ``n + 1``, each next child right
    after its elder sibling's subtrie)."""
    num_nodes = child_ptr.shape[0] - 1
    sub_end = np.empty(num_nodes, dtype=np.int64)
    sub_bytes = np.zeros((num_nodes, 4), dtype=np.int64)
    preorder = True
    for node in range(num_nodes - 1, -1, -1):
        end = node + 1
        for e in range(child_ptr[node], child_ptr[node + 1]):
            c = child_node[e]
            b = child_byte[e]
            if c != end:
                preorder = False
            end = sub_end[c] if c >= end else end
            for w in range(4):
                sub_bytes[node, w] |= sub_bytes[c, w]
            sub_bytes[node, b >> 6] |= np.int64(1) << (b & 63)
        sub_end[node] = end
    return sub_end, sub_bytes, preorder


try:   # a compiled loop when numba is installed; the same function in Python otherwise
    import numba as _numba
    _walk = _numba.njit(cache=True, nogil=True)(_walk_py)
    _subtrees = _numba.njit(cache=True, nogil=True)(_subtrees_py)
except ImportError:  # pragma: no cover - numba is a dependency; kept for odd platforms
    _walk = _walk_py
    _subtrees = _subtrees_py


# ---------------------------------------------------------------------- loop slices
_SLICES: "weakref.WeakKeyDictionary[VocabTrie, dict]" = weakref.WeakKeyDictionary()


def loop_slice(trie: VocabTrie, loop_bytes: np.ndarray):
    """``(loop_tokens [k], exit_byte [e], exit_child [e])`` of a byte set ``L`` (bool [256]):
    the tokens spelled by bytes of ``L`` alone, and the trie edges that leave that subtrie (the
    byte outside ``L`` and the child reached). Computed once per (vocabulary, ``L``) and shared
    (memoised on the trie)."""
    key = np.packbits(loop_bytes).tobytes()
    memo = _SLICES.setdefault(trie, {})
    got = memo.get(key)
    if got is None:
        nodes, exits = _subtrie(trie, np.asarray(loop_bytes, dtype=bool))
        inner = nodes[1:]
        counts = np.diff(trie.tok_ptr)[inner]
        starts = trie.tok_ptr[inner]
        idx = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        tokens = np.sort(trie.node_tokens[idx]).astype(np.int64)
        got = _bounded_put(memo, key, (tokens, trie.child_byte[exits].astype(np.int64),
                                        trie.child_node[exits].astype(np.int64)),
                           MAX_CACHED_SLICES)
    return got


# ---------------------------------------------------------------------- counted slices
_CLASS_SLICES: "weakref.WeakKeyDictionary[VocabTrie, dict]" = weakref.WeakKeyDictionary()
_NO_PRUNE: "weakref.WeakKeyDictionary[VocabTrie, np.ndarray]" = weakref.WeakKeyDictionary()
_PRUNE_NEVER = np.iinfo(np.int32).max
#: subsets larger than this are not looked up for translated masks
_MAX_TRANSLATED_SUBSET = 64
#: a state's row must have this many live bytes before its counted slices are looked for
COUNTED_MIN_BYTES = 8
#: ... and a repetition this many copies left (tokens of one or two characters of a class are
#: too few to pay for the class's slice)
COUNTED_MIN_COPIES = 3
#: ... and near a counter's end, at most this many copies left, the need bound of
#: :meth:`LazyByteDFA.class_depth` is looked for (the walk would enter every subtrie with a
#: token longer than the count)
DEPTH_CHECK_COPIES = 16


def _bounded_put(memo: dict, key, value, cap: int):
    """``memo[key] = value``, emptying ``memo`` first when it holds ``cap`` entries (a cache
    that a long-lived process fills schema after schema; entries are recomputed on demand)."""
    if len(memo) >= cap:
        memo.clear()
    memo[key] = value
    return value


class ClassSlice(NamedTuple):
    """The tokens of a char set ``C`` over a vocabulary (:func:`class_slice`).

    Attributes:
        tokens: int64, the tokens spelled by a string of ``Pref(C*)`` (``C``'s characters in
            UTF-8, the last one possibly cut), by increasing *need*: the characters a token
            starts (complete or cut), so a token is a prefix of ``C^r`` iff its need is ≤ r.
        off: int64 [N + 1]; ``tokens[:off[r]]`` are those of need ≤ r (N: the largest need).
        prune: int32 [trie nodes]; the largest need of the tokens below a node (the node's
            included) when all of them are in ``Pref(C*)``, else ``_PRUNE_NEVER``.
        vocab_size: the trie's vocabulary size.
        masks: ``{r: bool [vocab_size]}``, ``tokens[:off[r]]`` as a mask (built on first use).
    """
    tokens: np.ndarray
    off: np.ndarray
    prune: np.ndarray
    vocab_size: int
    masks: dict

    def mask(self, r: int) -> np.ndarray:
        """Read-only bool [vocabulary]: the tokens of need ≤ ``r`` (memoised; built from the
        memoised mask of the nearest count, whose tokens differ only by ``off[r]:off[r']``, as
        a counter's remaining count moves by a few per step)."""
        got = self.masks.get(r)
        if got is None:
            near = min(self.masks, key=lambda x: abs(x - r), default=None)
            if near is None:
                got = np.zeros(self.vocab_size, dtype=bool)
                got[self.tokens[:self.off[r]]] = True
            else:
                got = self.masks[near].copy()
                lo, hi = sorted((int(self.off[near]), int(self.off[r])))
                got[self.tokens[lo:hi]] = near < r
            got.setflags(write=False)
            _bounded_put(self.masks, r, got, MAX_MASKS_PER_SLICE)
        return got


def _no_prune(trie: VocabTrie) -> np.ndarray:
    got = _NO_PRUNE.get(trie)
    if got is None:
        got = _NO_PRUNE[trie] = np.zeros(trie.num_nodes, dtype=np.int32)
    return got


def class_slice(trie: VocabTrie, cls: CharSet) -> ClassSlice:
    """The :class:`ClassSlice` of char set ``cls`` over ``trie``: a breadth-first pass over the
    trie in step with ``C``'s one-character UTF-8 byte DFA (back to its start at each complete
    character), then the subtrie maxima bottom-up. Computed once per (vocabulary, ``C``) and
    shared by every state, pattern and schema (memoised on the trie)."""
    memo = _CLASS_SLICES.setdefault(trie, {})
    got = memo.get(cls.ranges)
    if got is not None:
        return got
    init, _, done_at, ctab = _class_runs(cls)       # C's one-character byte DFA
    ctab = ctab.astype(np.int64)
    N = trie.num_nodes
    ptr, nch = trie.child_ptr, np.diff(trie.child_ptr)
    need = np.full(N, -1, dtype=np.int64)
    chars = np.zeros(N, dtype=np.int64)
    xs = np.zeros(N, dtype=np.int64)
    need[0], xs[0] = 0, init
    levels = []
    frontier = np.zeros(1, dtype=np.int64) if init != DEAD else np.zeros(0, dtype=np.int64)
    while len(frontier):
        counts = nch[frontier]
        edges = ragged_indices(ptr[frontier], counts)
        src = np.repeat(frontier, counts)
        kid = trie.child_node[edges].astype(np.int64)
        levels.append((frontier, counts, kid))
        y = ctab[xs[src], trie.child_byte[edges]]
        ok = y != DEAD
        src, kid, y = src[ok], kid[ok], y[ok]
        done = done_at[y]
        chars[kid] = chars[src] + done
        xs[kid] = np.where(done, init, y)
        need[kid] = chars[kid] + (xs[kid] != init)
        frontier = kid
    ntok = np.diff(trie.tok_ptr)
    inside = need >= 0
    prune = np.where(inside, np.where(ntok > 0, need, 0), _PRUNE_NEVER).astype(np.int64)
    for parents, counts, kid in reversed(levels):    # children before parents
        has = counts > 0
        if has.any():
            first = (np.cumsum(counts) - counts)[has]
            parents = parents[has]
            prune[parents] = np.maximum(prune[parents], np.maximum.reduceat(prune[kid], first))
    nodes = np.flatnonzero(need > 0)
    tokens = trie.node_tokens[ragged_indices(trie.tok_ptr[nodes], ntok[nodes])].astype(np.int64)
    tneed = np.repeat(need[nodes], ntok[nodes])
    order = np.argsort(tneed, kind="stable")
    tokens, tneed = tokens[order], tneed[order]
    top = int(tneed[-1]) if len(tneed) else 0
    off = np.searchsorted(tneed, np.arange(top + 1), side="right").astype(np.int64)
    got = _bounded_put(memo, cls.ranges, ClassSlice(tokens, off, prune.astype(np.int32),
                                                    trie.vocab_size, {}), MAX_CACHED_SLICES)
    return got


_CLASS_RUNS: dict = {}


def _class_runs(cls: CharSet) -> tuple:
    """``(initial, per-state memo dicts, accepting, table)`` of the one-character UTF-8 byte
    DFA of char set ``cls`` (the subset construction of its byte-range trie, every state
    built; :func:`_class_targets` reads its rows), memoised per class."""
    got = _CLASS_RUNS.get(cls.ranges)
    if got is None:
        nfa = ByteNFA()
        s0, e0 = nfa.add_state(), nfa.add_state()
        nfa._charset(cls, s0, e0)
        cd = LazyByteDFA(nfa, s0, e0)
        todo, seen = [cd.initial], {DEAD, cd.initial}
        while todo:
            for r in np.unique(cd.row(todo.pop())).tolist():
                if r not in seen:
                    seen.add(r)
                    todo.append(r)
        n = cd.num_states
        got = _bounded_put(_CLASS_RUNS, cls.ranges,
                           (cd.initial, [dict() for _ in range(n)], cd.accepting[:n].copy(),
                            cd.table[:n].copy()), MAX_CACHED_SLICES)
    return got


def _class_targets(runs: tuple, x: int, lo: int, hi: int) -> tuple:
    """The states of a class DFA (:func:`_class_runs`) reached from ``x`` by a byte in
    ``[lo, hi]``, dead excluded."""
    return tuple(int(y) for y in np.unique(runs[3][x, lo:hi + 1]) if y != DEAD)


# ---------------------------------------------------------------------- the token automaton
_WALK_ARRAYS: "weakref.WeakKeyDictionary[VocabTrie, tuple]" = weakref.WeakKeyDictionary()


def _walk_arrays(trie: VocabTrie) -> tuple:
    """The trie's arrays as :func:`_walk` takes them (``child_byte`` widened to int64), made
    once per vocabulary rather than per compile (a copy of every trie edge: ~1 ms)."""
    got = _WALK_ARRAYS.get(trie)
    if got is None:
        got = _WALK_ARRAYS[trie] = (trie.child_ptr, trie.child_byte.astype(np.int64),
                                    trie.child_node, trie.tok_ptr, trie.node_tokens,
                                    *_trie_subtrees(trie))
    return got


def _trie_subtrees(trie: VocabTrie) -> tuple[np.ndarray, np.ndarray]:
    """``(sub_end, sub_bytes)`` for :func:`_walk`'s loop subtries (:func:`_subtrees`, once per
    vocabulary: ~1 ms and 32 bytes per node). A trie whose ids are not in pre-order gets
    ``sub_end[n] = n + 1`` (no subtrie is ever skipped)."""
    ptr = np.ascontiguousarray(trie.child_ptr, dtype=np.int64)
    sub_end, sub_bytes, preorder = _subtrees(ptr, np.ascontiguousarray(trie.child_byte,
                                                                      dtype=np.int64),
                                             np.ascontiguousarray(trie.child_node,
                                                                  dtype=np.int64))
    if not preorder:
        sub_end = np.arange(1, trie.num_nodes + 1, dtype=np.int64)
    return sub_end, sub_bytes


class LazyTokenDFA:
    """The all-encodings token automaton of a lazily determinised byte NFA (module docstring).

    The interface of :class:`~ctrlg.dfa.core.TokenDFA` that decoding uses: ``vocab_size``,
    ``initial``, ``is_accepting``, ``step``, ``run``, ``accepts``, plus :meth:`mask` (the
    allowed tokens of a state) and :meth:`materialize` (an eager TokenDFA of the states
    reachable within a budget).

    Args:
        bdfa: the lazy byte DFA.
        trie: the vocabulary's byte trie.
        eos_token_id: the EOS token (default the trie's; None: no EOS edges).
        vocab_size: V (default the vocabulary size; may be larger for padded LM heads).
        max_cached_masks: memoised masks (V bytes each) kept at most.
    """

    def __init__(self, bdfa: LazyByteDFA, trie: VocabTrie, *, eos_token_id=AUTO,
                 vocab_size: int | None = None, max_cached_masks: int = 4096, what="pattern"):
        self.bdfa = bdfa
        self.trie = trie
        self.eos_token_id = resolve_eos(trie, eos_token_id)
        self.vocab_size = resolve_vocab_size(trie, vocab_size, self.eos_token_id)
        self.max_cached_masks = int(max_cached_masks)
        self._masks: dict[int, np.ndarray] = {}
        self._edges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        self._token_bytes = trie.token_bytes
        self._trie_arrays = _walk_arrays(trie)
        self._out_tok = np.empty(trie.vocab_size + 1, dtype=np.int64)
        self._out_next = np.empty(trie.vocab_size + 1, dtype=np.int64)
        self._miss_node = np.empty(1 << 16, dtype=np.int64)
        self._miss_state = np.empty(1 << 16, dtype=np.int64)
        self._no_prune = _no_prune(trie)
        self._stamp = np.zeros(len(bdfa.computed), dtype=np.int64)
        self._loop_bits = np.zeros((len(bdfa.computed), 4), dtype=np.int64)
        self._loop_known = np.zeros(len(bdfa.computed), dtype=np.uint8)
        self._stamp_id = 0
        self._last_walk = (None, 0)
        #: translation key -> (state, copy index, run, (slice mask, limit), accepting)
        self._translated: dict = {}
        #: masks read off an earlier state by translation (a count, for profiling)
        self.translated_masks = 0
        if bdfa.initial == DEAD:
            raise UnsatisfiableConstraintError(f"the {what} matches no string{surrogate_hint(what)}")

    # ---------------------------------------------------------------- TokenDFA's questions
    @property
    def initial(self) -> int:
        return self.bdfa.initial

    @property
    def num_states(self) -> int:
        """States discovered so far (the automaton grows as it is explored)."""
        return self.bdfa.num_states

    def _state(self, state) -> int:
        """``state`` as an int, or ConstraintError unless it is an id handed out so far
        (``0 ≤ state < num_states``: a negative id must not read another state's row)."""
        try:
            if isinstance(state, (bool, float)):
                raise TypeError
            value = operator.index(state)
        except TypeError:
            raise ConstraintError(f"a state id must be an int, got {state!r}") from None
        if not 0 <= value < self.num_states:
            raise ConstraintError(f"state {value} out of range [0, {self.num_states}) (the "
                                  f"states this lazy automaton has built so far)")
        return value

    def is_accepting(self, state: int) -> bool:
        state = self._state(state)
        return state == ENDED and self.eos_token_id is not None or (
            state != ENDED and bool(self.bdfa.accepting[state]))

    def step(self, state: int, token: int) -> int:
        """δ(state, token): the byte DFA run over the token's bytes (rows built as needed)."""
        state, token = self._state(state), int(token)
        if not 0 <= token < self.vocab_size:
            raise ConstraintError(f"token id {token} out of range [0, {self.vocab_size})")
        if token == self.eos_token_id:
            return ENDED if self.is_accepting(state) else DEAD
        if state in (DEAD, ENDED) or token >= len(self._token_bytes):
            return DEAD
        data = self._token_bytes[token]
        if not data:
            return DEAD
        return self.bdfa.run_bytes(state, data)

    def run(self, tokens, state: int | None = None) -> int:
        q = self.initial if state is None else self._state(state)
        for t in tokens:
            q = self.step(q, t)
            if q == DEAD:
                return DEAD
        return q

    def accepts(self, tokens) -> bool:
        return self.is_accepting(self.run(tokens))

    # ---------------------------------------------------------------- masks
    def mask(self, state: int) -> np.ndarray:
        """Read-only bool [V]: the tokens whose successor from ``state`` is not dead (every
        non-dead state can still reach acceptance). Built on the first call per state."""
        state = self._state(state)
        got = self._masks.get(state)
        if got is not None:
            return got
        mask = np.zeros(self.vocab_size, dtype=bool)
        if state == ENDED:
            if self.eos_token_id is not None:
                mask[self.eos_token_id] = True
        elif state != DEAD:
            key = self.bdfa.translation_key(state) if self.bdfa._nfa is not None else None
            got = self._translated_mask(state, key) if key is not None else None
            if got is not None:
                mask = got
                self.translated_masks += 1
            else:
                tok, _, loop = self._expand(state, counted=True)
                if loop is not None and loop.dtype == np.bool_:
                    mask[:len(loop)] = loop
                elif loop is not None:
                    mask[loop] = True
                mask[tok] = True
                if self.eos_token_id is not None:
                    mask[self.eos_token_id] = bool(self.bdfa.accepting[state])
                if key is not None and self._last_walk[0] is not None:
                    self._register_translation(state, key, mask)
        mask.setflags(write=False)
        if len(self._masks) < self.max_cached_masks:
            self._masks[state] = mask
        return mask

    def allowed_tokens(self, state: int) -> np.ndarray:
        """The ids of :meth:`mask` (int64, sorted)."""
        return np.flatnonzero(self.mask(state))

    def _expand(self, q: int, counted: bool = False):
        """``(tokens, next states, allowed tokens or None)`` of live state ``q`` (EOS not
        treated). The third part, tokens allowed from ``q`` whose successor is not listed, is a
        loop slice (its tokens lead back to ``q``) or, with ``counted`` (masks only: the
        successors are not needed), a counted slice (:meth:`_counted_slice`) as a read-only
        bool mask over the trie's vocabulary."""
        b = self.bdfa
        row = b.row(q)
        loop = None
        loop_bytes = row == q
        seed_node = np.zeros(1, dtype=np.int64)
        seed_state = np.full(1, q, dtype=np.int64)
        prune, limit = self._no_prune, -1
        if loop_bytes.sum() >= 2:
            tokens, exit_byte, exit_child = loop_slice(self.trie, loop_bytes)
            if len(tokens) >= SLICE_MIN_FRACTION * self.trie.vocab_size:
                loop = tokens
                nxt = row[exit_byte]
                keep = nxt != DEAD
                seed_node, seed_state = exit_child[keep], nxt[keep].astype(np.int64)
        if loop is None and counted and np.count_nonzero(row) >= COUNTED_MIN_BYTES:
            got = self._counted_slice(q)
            if got is not None:
                loop, prune, limit = got
        ptr, byte, child, tptr, ntok, sub_end, sub_bytes = self._trie_arrays
        nodes, states, record, n = seed_node, seed_state, True, 0
        self._stamp_id += 1
        self._last_walk = ((loop, limit) if prune is not self._no_prune else None,
                           self._stamp_id)
        while True:      # resume from the pairs whose rows were missing until none is
            if len(self._stamp) < len(b.computed):
                grow = len(b.computed) - len(self._stamp)
                self._stamp = np.concatenate([self._stamp, np.zeros(grow, np.int64)])
                self._loop_bits = np.concatenate([self._loop_bits,
                                                  np.zeros((grow, 4), np.int64)])
                self._loop_known = np.concatenate([self._loop_known, np.zeros(grow, np.uint8)])
            n, m = _walk(b.table, b.computed, ptr, byte, child, tptr, ntok, nodes, states,
                         record, self._out_tok, self._out_next, n, self._miss_node,
                         self._miss_state, prune, limit, self._stamp, self._stamp_id,
                         sub_end, sub_bytes, self._loop_bits, self._loop_known)
            if not m:
                break
            if m > len(self._miss_node):     # too many to resume from: build, start afresh
                b.build_rows(np.unique(self._miss_state).tolist())
                nodes, states, record, n = seed_node, seed_state, True, 0
                continue
            b.build_rows(np.unique(self._miss_state[:m]).tolist())
            nodes, states, record = self._miss_node[:m].copy(), self._miss_state[:m].copy(), False
        tok, nxt = self._out_tok[:n].copy(), self._out_next[:n].copy()
        if self.eos_token_id is not None and len(tok):      # an EOS with bytes is only EOS
            keep = tok != self.eos_token_id
            tok, nxt = tok[keep], nxt[keep]
        if loop is not None and loop.dtype != np.bool_ and self.eos_token_id is not None:
            loop = loop[loop != self.eos_token_id]
        return tok, nxt, loop

    # ---------------------------------------------------------------- masks by translation
    def _translated_mask(self, q: int, key):
        """The mask of ``q`` read off an earlier state ``p`` with ``σ^i(S_p) = S_q`` (same
        translation key, ``i > 0``), or None. Exact when ``i`` is at most ``p``'s run (every NFA
        state of every DFA state ``p``'s walk popped commutes with ``σ`` ``i`` times in a row,
        :meth:`TemplateNFA.run_of`): then ``move`` and ``closure`` commute with ``σ^i`` along
        the walk, whose pairs from ``q`` are those from ``p`` with states moved by ``σ^i``, so
        the same tokens live — provided the walk is cut alike (the same counted slice and
        count) and acceptance agrees."""
        (k, *_), c = key
        hit = self._translated.get(key[0])
        if hit is None:
            return None
        p, c0, run, sig, accepting = hit
        if not 0 < c - c0 <= run or bool(self.bdfa.accepting[q]) != accepting:
            return None
        mask = self._masks.get(p)
        got = self._counted_slice(q) if mask is not None else None
        if got is None or got[0] is not sig[0] or got[2] != sig[1]:
            return None
        return mask

    def _register_translation(self, q: int, key, mask) -> None:
        """Keep ``q`` (whose mask was just walked with a counted slice) as the base of later
        states of its translation key: its run is the least :meth:`TemplateNFA.run_of` over
        the NFA states of the DFA states its walk popped."""
        b = self.bdfa
        nfa = b._nfa
        (k, *_), c = key
        sig, sid = self._last_walk
        visited = np.flatnonzero(self._stamp[:b.num_states] == sid).tolist()
        ys = set()
        for p in visited:
            if p not in (DEAD, ENDED):
                ys.update(b._sets[p])
        lo, hi, _ = nfa.regions[k]
        last = max((y for y in ys if lo <= y < hi), default=None)
        if last is not None and nfa.run_of(k, last) == 0:   # the walk reached the last copy
            return
        run = MAX_LAZY_NFA_STATES
        for y in ys:
            run = min(run, nfa.run_of(k, y))
            if run == 0:
                return
        old = self._translated.get(key[0])
        if old is None or old[2] - (c - old[1]) < run:
            self._translated[key[0]] = (q, c, run, sig, bool(b.accepting[q]))

    def _counted_slice(self, q: int):
        """``(tokens, prune, limit)`` of the best counted slice of ``q``, or None: an NFA state
        of ``q``'s subset that starts a copy of a repeated item with char-set alternative ``C``
        and ``r`` copies still possible (:attr:`TemplateNFA.counted`) gives
        ``Pref(L(q)) ⊇ Pref(C^r)``, so every token spelled by a string of ``Pref(C^{≤r})``
        (:func:`class_slice`, tokens of need ≤ r) is allowed; the walk skips the subtries made
        of such tokens only (``prune[node] <= r``) and finds the others as before. Near a
        counter's end (``r`` below the longest token's need, at most
        :data:`DEPTH_CHECK_COPIES`), when :meth:`LazyByteDFA.class_depth` shows that no string
        of ``Pref(C*)`` of need above ``r`` is live from ``q``, the tokens of need ≤ r are
        exactly the allowed tokens of ``Pref(C*)``: the walk then skips every subtrie made of
        tokens of ``Pref(C*)`` (limit ``_PRUNE_NEVER - 1``), and a count below
        :data:`COUNTED_MIN_COPIES` is used too."""
        notes_of = self.bdfa.notes_of
        if notes_of is None:
            return None
        best, best_count = None, max(int(SLICE_MIN_FRACTION * self.trie.vocab_size) - 1, 0)
        seen = set()
        small = []
        for s in self.bdfa._sets[q]:
            for cls, r in notes_of(s):
                if (cls, r) in seen:
                    continue
                seen.add((cls, r))
                if r is not None and r < COUNTED_MIN_COPIES:
                    if r >= 1:
                        small.append((r, cls))
                    continue
                sl = class_slice(self.trie, cls)
                k = len(sl.off) - 1 if r is None else min(r, len(sl.off) - 1)
                if sl.off[k] > best_count:
                    best, best_count = (sl, k, cls), int(sl.off[k])
        if best is None:
            for r, cls in sorted(small, key=lambda x: -x[0]):
                if self.bdfa.class_depth(q, cls, r) is not None:
                    sl = class_slice(self.trie, cls)
                    k = min(r, len(sl.off) - 1)
                    return sl.mask(k), sl.prune, _PRUNE_NEVER - 1
            return None
        sl, k, cls = best
        if k == len(sl.off) - 1:
            return sl.mask(k), sl.prune, _PRUNE_NEVER - 1
        if k <= DEPTH_CHECK_COPIES and self.bdfa.class_depth(q, cls, k) is not None:
            return sl.mask(k), sl.prune, _PRUNE_NEVER - 1
        return sl.mask(k), sl.prune, k

    # ---------------------------------------------------------------- eager views
    def successors(self, state: int) -> np.ndarray:
        """int64 [V]: δ(state, v) for every token (EOS included)."""
        out = np.zeros(self.vocab_size, dtype=np.int64)
        state = int(state)
        if state not in (DEAD, ENDED):
            tok, nxt, loop = self._expand(state)
            if loop is not None:
                out[loop] = state
            out[tok] = nxt
        if self.eos_token_id is not None:
            out[self.eos_token_id] = ENDED if self.is_accepting(state) else DEAD
        return out

    def within_budget(self, max_new_tokens: int | None) -> TokenDFA:
        """An eager TokenDFA with this automaton's language, for tables over a budget of
        ``max_new_tokens`` tokens (the processor restricts it to the states the budget reaches,
        :func:`ctrlg.dfa.ops.restrict_to_budget`): every byte row reachable from the initial
        state is built, then the vectorised all-encodings index of :mod:`ctrlg.dfa.regex_index`
        (letters, loop tokens) runs over that byte DFA — far cheaper than :meth:`materialize`'s
        state-by-state walks. Built once (memoised)."""
        memo = self.__dict__.setdefault("_budget_dfas", {})
        if "all" not in memo:
            b = self.bdfa
            todo = [b.initial]
            seen = {DEAD, ENDED, b.initial}
            while todo:
                q = todo.pop()
                for r in np.unique(b.row(q)).tolist():
                    if r not in seen:
                        seen.add(r)
                        todo.append(r)
            Q = b.num_states
            bdfa = ByteDFA(table=b.table[:Q].copy(), accepting=b.accepting[:Q].copy(),
                           initial=b.initial)
            d = token_dfa_from_bytes_dfa(bdfa, self.trie, eos_token_id=self.eos_token_id,
                                         vocab_size=self.vocab_size)
            memo["all"] = d
        return memo["all"]

    def materialize(self, max_new_tokens: int | None = None, *, max_states: int = 200_000
                    ) -> TokenDFA:
        """An eager :class:`TokenDFA` of the states reachable from the initial state within
        ``max_new_tokens`` tokens (all reachable states when None), breadth first; the others
        are folded into the dead state. Its language agrees with this automaton's on every
        sequence of at most ``max_new_tokens`` tokens (what the Ctrl-G guide's tables over a
        budget need). ConstraintError past ``max_states`` states."""
        index = {DEAD: 0, self.initial: 1}
        order = [DEAD, self.initial]
        depth = {self.initial: 0}
        rows = {0: None}
        head = 1
        while head < len(order):
            q = order[head]
            head += 1
            succ = self.successors(q)
            d = depth[q]
            if max_new_tokens is not None and d >= max_new_tokens:
                succ = np.zeros_like(succ)          # beyond the budget: nothing is needed
            else:
                for r in np.unique(succ).tolist():
                    if r not in index:
                        if len(order) >= max_states:
                            raise ConstraintError(
                                f"materialize: more than {max_states:,} states within "
                                f"{max_new_tokens} tokens")
                        index[r] = len(order)
                        order.append(r)
                        depth[r] = d + 1
            rows[index[q]] = succ
        S = len(order)
        remap = np.vectorize(index.get, otypes=[np.int64])
        default = np.zeros(S, dtype=np.int64)
        ptr = np.zeros(S + 1, dtype=np.int64)
        toks, nexts = [], []
        for i in range(1, S):
            succ = rows[i]
            values, counts = np.unique(succ, return_counts=True)
            local = remap(values)
            dflt = values[np.argmax(counts)]
            default[i] = index[int(dflt)]
            exc = np.flatnonzero(succ != dflt)
            toks.append(exc)
            nexts.append(local[np.searchsorted(values, succ[exc])])
            ptr[i + 1] = len(exc)
        np.cumsum(ptr, out=ptr)
        accepting = np.array([self.is_accepting(q) if q != DEAD else False for q in order])
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))
        return TokenDFA(vocab_size=self.vocab_size, initial=1, accepting=accepting,
                        default=default, exc_ptr=ptr, exc_tokens=cat(toks), exc_next=cat(nexts))

    def __repr__(self) -> str:
        return (f"LazyTokenDFA(V={self.vocab_size}, states built={self.num_states}, "
                f"masks cached={len(self._masks)})")


def lazy_regex(pattern: str, tokenizer, *, eos_token_id=AUTO, vocab_size: int | None = None,
               what: str | None = None) -> LazyTokenDFA:
    """The :class:`LazyTokenDFA` of ``pattern`` (full match, :mod:`ctrlg.dfa.regex_syntax`
    syntax) over a tokenizer / :class:`ctrlg.Vocabulary` / :class:`VocabTrie` / token bytes: the
    language of :func:`ctrlg.dfa.regex` with ``encodings="all"``, built on demand.

    Raises RegexError / UnsupportedRegexError for a bad pattern (or one of more than
    :data:`MAX_LAZY_NFA_STATES` character positions with repetitions counted out),
    UnsatisfiableConstraintError when the pattern matches no string."""
    trie = vocab_trie(tokenizer)
    nfa, start, accept = lazy_thompson(parse(pattern))
    return LazyTokenDFA(LazyByteDFA(nfa, start, accept), trie, eos_token_id=eos_token_id,
                        vocab_size=vocab_size, what=what or f"regex {pattern[:200]!r}")
