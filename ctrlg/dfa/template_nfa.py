"""Thompson's construction by templates (the NFA half of :mod:`ctrlg.dfa.lazy`).

:class:`TemplateNFA` builds a char set's UTF-8 byte-range trie, or the item of a counted
repetition, once as a template and copies it by renaming states; it records the counted-slice
notes and the fixed-stride regions of counters that :class:`ctrlg.dfa.lazy.LazyTokenDFA` reads
(counted slices, masks by translation). :mod:`ctrlg.dfa.lazy_nfa` grows the same automaton on
demand.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ctrlg.dfa.bytes_dfa import ByteNFA
from ctrlg.dfa.regex_syntax import Alternation, CharSet, Node, Repeat
from ctrlg.errors import RegexError

__all__ = ["TemplateNFA", "MAX_LAZY_NFA_STATES"]

#: character positions (repetitions counted out) of a lazy pattern: the bound on its NFA,
#: checked on the AST (the NFA itself is built on demand, :mod:`ctrlg.dfa.lazy_nfa`)
MAX_LAZY_NFA_STATES = 20_000_000


# ---------------------------------------------------------------------- Thompson NFA, by templates
#: fragments (char sets, repeated items) kept across patterns, keyed by their AST node
_TEMPLATES: dict = {}
_MAX_TEMPLATES = 4096
_MAX_SHARED_TEMPLATE_STATES = 4096


class TemplateNFA(ByteNFA):
    """:class:`~ctrlg.dfa.bytes_dfa.ByteNFA` (Thompson's construction) that builds a char set's
    UTF-8 byte-range trie, or the item of a counted repetition ``x{m,n}``, once as a *template*
    (local ids: 0 = start, 1 = end, 2.. inner states) and copies it by renaming states. The
    result is the same automaton up to state numbering; templates of small fragments are kept
    across patterns (a JSON string's character, a number, a format), so a schema's NFA costs
    O(states) list operations rather than re-encoding every class. ``has_empty`` records an
    empty char set (the only source of NFA states that cannot reach acceptance)."""

    def __init__(self):
        super().__init__()
        self.has_empty = False
        self._blocks: list = []      # (first inner state, template, start, end), by first state
        self._starts: list = []
        #: NFA state -> [(class, r)]: the state starts a copy of a repeated item one of whose
        #: alternatives is the char set ``class``, with at least ``r`` copies (None: unboundedly
        #: many) still possible, so ``Pref(L(state)) ⊇ Pref(class^r)`` (counted slices)
        self.counted: dict[int, list] = {}
        #: ``(lo, hi, d)`` per bounded repeat of a template item with 3 copies or more, by
        #: ``lo``: its copies' states ``[lo, hi)``, copy ``j + 1`` being copy ``j`` moved by ``d``
        #: (:meth:`translates`)
        self.regions: list[tuple[int, int, int]] = []
        #: ``lo`` of each region, in order (for bisecting a state to its region)
        self.region_los: list[int] = []
        self._translates: dict = {}
        self._runs: dict = {}

    def build(self, node: Node, start: int, end: int) -> None:
        if isinstance(node, CharSet):
            self._class(node, start, end)
        elif isinstance(node, Repeat) and (node.max is None or node.max) and \
                (node.min + (0 if node.max is None else node.max - node.min)) >= 2:
            tmpl = self._template(node.item)
            ends: list[int] = []

            def copy(s: int, e: int) -> None:
                ends.append(e)
                self._instantiate(tmpl, s, e)
            self._repeat(node, start, end, self._noting(node, copy))
            d = ends[1] - ends[0] if len(ends) >= 3 else 0
            if node.max is not None and d > 0 and \
                    all(b - a == d for a, b in zip(ends, ends[1:])) and \
                    (not self.regions or self.regions[-1][1] <= ends[0]):
                self.regions.append((ends[0], len(self.edges), d))
                self.region_los.append(ends[0])
        elif isinstance(node, Repeat) and (node.max is None or node.max):
            self._repeat(node, start, end,
                         self._noting(node, lambda s, e: self.build(node.item, s, e)))
        else:
            super().build(node, start, end)

    def _class(self, node: CharSet, start: int, end: int) -> None:
        """A char set between ``start`` and ``end``: an ASCII class as one byte edge per range
        (all its template would hold), any other from its UTF-8 template."""
        if node.ranges and node.ranges[-1][1] < 0x80:
            self.edges[start] += tuple([(lo, hi, end) for lo, hi in node.ranges])
        else:
            self._instantiate(self._template(node), start, end)

    def _noting(self, node: Repeat, item):
        """``item`` (wires one copy of ``node.item``), also recording in :attr:`counted` the
        start state of each copy when the item has a char-set alternative: copy ``j`` (in the
        order :meth:`~ctrlg.dfa.bytes_dfa.ByteNFA._repeat` wires them) can still be followed by
        ``max - j`` copies in all (unboundedly many when ``max`` is None)."""
        cls = _item_class(node.item)
        if cls is None:
            return item
        copies = [0]

        def wire(s: int, e: int) -> None:
            r = None if node.max is None else node.max - copies[0]
            copies[0] += 1
            self.counted.setdefault(s, []).append((cls, r))
            item(s, e)
        return wire

    def _template(self, node: Node):
        got = _TEMPLATES.get(node)
        if got is None:
            scratch = TemplateNFA()
            s, e = scratch.add_state(), scratch.add_state()
            if isinstance(node, CharSet):
                ByteNFA._charset(scratch, node, s, e)
                scratch.has_empty = not node.ranges
            else:
                scratch.build(node, s, e)
            scratch.resolve_all()
            notes = scratch.counted
            if scratch._blocks:                  # notes of nested copies, by local id
                notes = {x: ns for x in range(len(scratch.edges)) if (ns := scratch.notes_of(x))}
            got = (len(scratch.edges) - 2, scratch.edges, scratch.eps, scratch.has_empty, notes)
            if len(scratch.edges) <= _MAX_SHARED_TEMPLATE_STATES:
                if len(_TEMPLATES) >= _MAX_TEMPLATES:
                    _TEMPLATES.clear()
                _TEMPLATES[node] = got
        return got

    def add_state(self) -> int:
        if len(self.edges) >= MAX_LAZY_NFA_STATES:
            raise RegexError(f"regex automaton exceeds {MAX_LAZY_NFA_STATES:,} NFA states")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def _instantiate(self, tmpl, start: int, end: int) -> None:
        """A copy of ``tmpl`` between ``start`` and ``end``: the edges out of ``start`` and
        ``end`` now, those of the inner states (never changed afterwards) on first use
        (:meth:`edges_of`)."""
        inner, edges, eps, has_empty, notes = tmpl
        base = len(self.edges) - 2
        if len(self.edges) + inner > MAX_LAZY_NFA_STATES:
            raise RegexError(f"regex automaton exceeds {MAX_LAZY_NFA_STATES:,} NFA states")
        self.has_empty |= has_empty

        for x, y in ((0, start), (1, end)):
            if edges[x]:
                self.edges[y] += _renamed_edges(edges[x], base, start, end)
            if eps[x]:
                self.eps[y] += _renamed(eps[x], base, start, end)
        if notes:
            for x, y in ((0, start), (1, end)):
                if x in notes:
                    self.counted.setdefault(y, []).extend(notes[x])
        if inner:
            self._blocks.append((base + 2, tmpl, start, end))
            self.edges.extend([None] * inner)
            self.eps.extend([None] * inner)

    def _resolve(self, s: int) -> None:
        """Fill in the edges of inner template state ``s`` (renamed from its template)."""
        k = bisect.bisect_right(self._block_starts(), s) - 1
        first, (inner, edges, eps, _, _), start, end = self._blocks[k]
        base = first - 2

        local = s - base
        self.edges[s] = _renamed_edges(edges[local], base, start, end)
        self.eps[s] = _renamed(eps[local], base, start, end)

    def _block_starts(self) -> list:
        if len(self._starts) != len(self._blocks):
            self._starts = [b[0] for b in self._blocks]
        return self._starts

    def notes_of(self, s: int) -> list:
        """The :attr:`counted` notes of state ``s``, those of a copied template's inner
        states included (renaming keeps them true)."""
        got = self.counted.get(s, [])
        if self._blocks and s >= self._blocks[0][0]:
            k = bisect.bisect_right(self._block_starts(), s) - 1
            first, tmpl, _, _ = self._blocks[k]
            local = s - first + 2
            if local < tmpl[0] + 2 and local in tmpl[4]:
                got = got + tmpl[4][local]
        return got

    def translates(self, k: int, y: int) -> bool:
        """Whether the translation ``σ`` of region ``k`` (``x ↦ x + d`` on ``[lo, hi)``, the
        identity elsewhere) commutes with the edges and ε-moves of state ``y``:
        ``edges(σ(y)) = σ(edges(y))``, ``eps(σ(y)) = σ(eps(y))``, with ``σ`` defined on every
        target (memoised). An inner state of a copied template does when ``σ(y)`` is the same
        inner state of a copy of the same template placed ``d`` later between ``σ(start)`` and
        ``σ(end)`` (renaming commutes with ``σ``); other states are compared edge by edge."""
        key = (k, y)
        got = self._translates.get(key)
        if got is None:
            got = self._translates[key] = self._check_translates(k, y)
        return got

    def _check_translates(self, k: int, y: int) -> bool:
        lo, hi, d = self.regions[k]

        def sigma(x):
            return x + d if lo <= x < hi else x

        if not lo <= y < hi:
            return not any(lo <= t < hi for _, _, t in self.edges_of(y)) and \
                not any(lo <= t < hi for t in self.eps_of(y))
        y2 = y + d
        if y2 >= hi:
            return False
        b1, b2 = self._block_of(y), self._block_of(y2)
        if b1 is not None and b2 is not None:
            # renaming: inner targets stay in the copies, which lie in [lo, hi) (allocated
            # during the repeat); start / end must be moved alike (σ(e1) ≥ hi never equals e2)
            return self._copy_moved(k, b1, b2)
        if b1 is not None or b2 is not None:
            return False
        if any(lo <= t < hi and t + d >= hi for _, _, t in self.edges_of(y)) or \
                any(lo <= t < hi and t + d >= hi for t in self.eps_of(y)):
            return False
        return (set(self.edges_of(y2)) == {(a, b, sigma(t)) for a, b, t in self.edges_of(y)}
                and set(self.eps_of(y2)) == {sigma(t) for t in self.eps_of(y)})

    def run_of(self, k: int, y: int) -> int:
        """How many times in a row region ``k``'s translation commutes from ``y``: the
        largest ``n`` with :meth:`translates` true at ``y, y + d, …, y + (n - 1)d`` (states
        outside the region are fixed: unbounded, ``MAX_LAZY_NFA_STATES``). Memoised."""
        lo, hi, d = self.regions[k]
        if not lo <= y < hi:
            return MAX_LAZY_NFA_STATES if self.translates(k, y) else 0
        got = self._runs.get((k, y))
        if got is not None:
            return got
        blk = self._block_index(y)
        if blk is not None:          # an inner state of a copy: its block's run
            return self._block_run(k, blk)
        chain = []
        x = y
        while (k, x) not in self._runs:
            if not self.translates(k, x):
                self._runs[(k, x)] = 0
                break
            chain.append(x)
            x += d
        n = self._runs[(k, x)]
        for x in reversed(chain):
            n += 1
            self._runs[(k, x)] = n
        return self._runs[(k, y)]

    def _block_index(self, s: int):
        """The index in ``_blocks`` of the block whose inner states hold ``s``, or None."""
        if not self._blocks or s < self._blocks[0][0]:
            return None
        i = bisect.bisect_right(self._block_starts(), s) - 1
        blk = self._blocks[i]
        return i if s < blk[0] + blk[1][0] else None

    def _block_run(self, k: int, i: int) -> int:
        """:meth:`run_of` of every inner state of block ``i`` at once: :meth:`translates`
        holds at an inner state exactly when the block ``d`` later is a copy of the same
        template between ``σ(start)`` and ``σ(end)`` (:meth:`_check_translates`), which does
        not depend on the state's place in the block, so the run is counted block by block
        (memoised per block; a region's copies are consecutive blocks)."""
        lo, hi, d = self.regions[k]
        memo = self._runs
        chain = []
        while (k, "b", i) not in memo:
            f1, t1 = self._blocks[i][:2]
            y2 = f1 + d
            j = self._block_index(y2) if y2 + t1[0] <= hi else None
            if j is None or f1 < lo or not self._copy_moved(k, self._blocks[i], self._blocks[j]):
                memo[(k, "b", i)] = 0
                break
            chain.append(i)
            i = j
        n = memo[(k, "b", i)]
        for x in reversed(chain):
            n += 1
            memo[(k, "b", x)] = n
        return n

    def _copy_moved(self, k: int, b1: tuple, b2: tuple) -> bool:
        """Whether block ``b2`` is block ``b1`` moved by region ``k``'s translation ``σ``: a
        copy of the same template placed ``d`` later, between ``σ(start)`` and ``σ(end)``."""
        lo, hi, d = self.regions[k]
        (f1, t1, s1, e1), (f2, t2, s2, e2) = b1, b2
        return t1 is t2 and f2 == f1 + d and s2 == (s1 + d if lo <= s1 < hi else s1) and \
            e2 == (e1 + d if lo <= e1 < hi else e1)

    def _block_of(self, s: int):
        """The block ``(first, template, start, end)`` whose inner states hold ``s``, or None."""
        i = self._block_index(s)
        return None if i is None else self._blocks[i]

    def edges_of(self, s: int) -> Sequence[tuple[int, int, int]]:
        if self.edges[s] is None:
            self._resolve(s)
        return self.edges[s]

    def eps_of(self, s: int) -> Sequence[int]:
        if self.eps[s] is None:
            self._resolve(s)
        return self.eps[s]

    def resolve_all(self) -> None:
        """Fill in every inner state (for a pass over the whole automaton)."""
        for s, e in enumerate(self.edges):
            if e is None:
                self._resolve(s)


def _renamed(targets, base: int, start: int, end: int) -> tuple:
    """Template-local state ids as a copy's: 0 → ``start``, 1 → ``end``, x → ``base + x``
    (written out inline: it runs once per edge of every state the subset construction meets).
    A tuple: the garbage collector stops tracking it (a walk reads tens of thousands)."""
    return tuple([base + t if t > 1 else end if t else start for t in targets])


def _renamed_edges(edges, base: int, start: int, end: int) -> tuple:
    """:func:`_renamed` on the targets of ``(lo, hi, target)`` edges."""
    return tuple([(lo, hi, base + t if t > 1 else end if t else start) for lo, hi, t in edges])


#: item -> its class, by object identity (the entry holds the item, so its id stays its own);
#: emptied when full. A lazy NFA asks again for every copy of a repetition it expands, and a
#: grammar's item may hold hundreds of ranges to merge.
_ITEM_CLASSES: dict[int, tuple[Node, "CharSet | None"]] = {}
MAX_ITEM_CLASSES = 512


def _item_class(item: Node) -> CharSet | None:
    """The union of the char-set alternatives of a repeated item (the item itself when it is a
    char set; ``(?:[^"\\]|\\.)`` gives ``[^"\\]``), or None when it has none. Memoised
    per item object (:data:`_ITEM_CLASSES`)."""
    hit = _ITEM_CLASSES.get(id(item))
    if hit is not None and hit[0] is item:
        return hit[1]
    cls = _merged_class(item)
    if len(_ITEM_CLASSES) >= MAX_ITEM_CLASSES:
        _ITEM_CLASSES.clear()
    _ITEM_CLASSES[id(item)] = (item, cls)
    return cls


def _merged_class(item: Node) -> CharSet | None:
    alts = item.items if isinstance(item, Alternation) else (item,)
    ranges = sorted(r for a in alts if isinstance(a, CharSet) for r in a.ranges)
    if not ranges:
        return None
    merged = [list(ranges[0])]
    for lo, hi in ranges[1:]:
        if lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return CharSet(tuple((lo, hi) for lo, hi in merged))


# ---------------------------------------------------------------------- lazy subset construction
