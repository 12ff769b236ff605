"""Numbers of a JSON Schema as regexes: integer and decimal ranges, fractional and exclusive
bounds, ``multipleOf``.

* Integer ranges are exact: any integer interval is a regular set of digit strings
  (:func:`integer_range`, digit-by-digit alternatives, no leading zeros).
* Decimal ranges (``type: number``) are exact for integer inclusive bounds (decimals without
  exponent, :func:`number_range`); other bounds are rounded inwards to integers (a subset: the
  decimals between the integer bounds); when no integer lies inside, the decimals with the
  fewest fractional digits that fit are listed (e.g. ``(0.1, 0.5)`` → ``0.2 … 0.4``).
* ``multipleOf`` is a finite subset: up to :data:`MAX_MULTIPLES` multiples inside the bounds,
  nearest the lower bound (or around 0), each checked the way ``jsonschema`` checks it
  (``instance % m`` for an integer ``m``; ``int(q) == q`` with ``q = instance / m`` for a
  fractional one, which rejects ``0.07`` as a multiple of ``0.01``).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from ctrlg.errors import SchemaError, UnsupportedSchemaError

__all__ = ["INTEGER", "NUMBER", "integer_range", "number_range", "multiples", "MAX_MULTIPLES"]

INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
MAX_MULTIPLES = 1000
MAX_DECIMALS = 200


class Bounds:
    """A numeric interval: ``lo``/``hi`` (``None``: unbounded) and whether each is exclusive."""

    def __init__(self, lo=None, lo_excl=False, hi=None, hi_excl=False):
        self.lo, self.lo_excl, self.hi, self.hi_excl = lo, lo_excl, hi, hi_excl

    def contains(self, v) -> bool:
        if self.lo is not None and (v < self.lo or self.lo_excl and v == self.lo):
            return False
        return not (self.hi is not None and (v > self.hi or self.hi_excl and v == self.hi))

    def int_lo(self):
        if self.lo is None:
            return None
        f = math.floor(self.lo)
        return f + 1 if (f < self.lo or self.lo_excl) else f

    def int_hi(self):
        if self.hi is None:
            return None
        c = math.ceil(self.hi)
        return c - 1 if (c > self.hi or self.hi_excl) else c

    def unbounded(self) -> bool:
        return self.lo is None and self.hi is None


def _literals(texts) -> str:
    texts = [t.replace(".", r"\.") for t in texts]
    return texts[0] if len(texts) == 1 else "(?:" + "|".join(texts) + ")"


def integer_range(b: Bounds, path: str) -> str:
    """Integers within ``b`` (exact)."""
    if b.unbounded():
        return INTEGER
    lo, hi = b.int_lo(), b.int_hi()
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(f"no integer lies within the bounds at {path} "
                          f"(minimum {b.lo!r} > maximum {b.hi!r} or exclusive)")
    return _signed(lo, hi, fraction=False)


def number_range(b: Bounds, path: str) -> str:
    """Decimals within ``b`` (module docstring: exact for integer inclusive bounds)."""
    if b.unbounded():
        return NUMBER
    if b.lo is not None and b.hi is not None and (b.lo > b.hi or b.lo == b.hi and
                                                  (b.lo_excl or b.hi_excl)):
        raise SchemaError(f"no number lies within the bounds at {path} "
                          f"(minimum {b.lo!r}, maximum {b.hi!r})")
    lo, hi = b.int_lo(), b.int_hi()
    if lo is None or hi is None or lo <= hi:
        return _signed(lo, hi, fraction=True)
    for digits in range(1, 7):
        scale = 10 ** digits
        first, last = math.floor(Decimal(repr(b.lo)) * scale), math.ceil(Decimal(repr(b.hi)) * scale)
        texts = []
        for n in range(first, min(last, first + MAX_DECIMALS * 10) + 1):
            text = str(Decimal(n) / scale)
            if "." in text and b.contains(float(text)) and text not in texts:
                texts.append(text)
            if len(texts) == MAX_DECIMALS:
                break
        if texts:
            return _literals(texts)
    raise UnsupportedSchemaError(f"the bounds at {path} admit no decimal with at most 6 "
                                 f"fractional digits")


def multiples(m, b: Bounds, integer: bool, path: str) -> str:
    """A finite subset of the multiples of ``m`` within ``b`` (module docstring)."""
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
        raise SchemaError(f"'multipleOf' at {path}/multipleOf must be a positive number, got {m!r}"
                          + (" (a JSON number below about 1e-324 underflows to 0)"
                             if m == 0 and isinstance(m, float) else ""))
    if isinstance(m, float) and math.isinf(m):
        raise SchemaError(f"'multipleOf' at {path}/multipleOf is {m} (a JSON number beyond "
                          f"±1.8e308 overflows to infinity): no finite number but 0 is a "
                          f"multiple of it, and jsonschema's check accepts every number; give "
                          f"a finite multipleOf")
    whole = isinstance(m, int) or m.is_integer()
    if whole:
        step = int(m)
        if b.lo is not None:
            k0 = math.ceil(b.lo / step) - 1
        elif b.hi is not None:
            k0 = math.floor(b.hi / step) - MAX_MULTIPLES + 1
        else:
            k0 = -(MAX_MULTIPLES // 2)
        texts = [str(k * step) for k in range(k0, k0 + MAX_MULTIPLES + 2)
                 if b.contains(k * step)]
    else:
        dm = Decimal(repr(m))
        if b.lo is not None:
            k0 = math.floor(Decimal(repr(b.lo)) / dm) - 1
        elif b.hi is not None:
            k0 = math.floor(Decimal(repr(b.hi)) / dm) - MAX_MULTIPLES + 1
        else:
            k0 = -(MAX_MULTIPLES // 2)
        texts = []
        for k in range(k0, k0 + MAX_MULTIPLES + 2):
            text = format((dm * k).normalize(), "f")
            if text in ("-0", "0") or "." not in text:
                text = str(int(Decimal(text)))
            value = float(text) if "." in text else int(text)
            if b.contains(value) and _float_multiple(value, m) and (not integer or "." not in text):
                texts.append(text)
    texts = list(dict.fromkeys(texts))[:MAX_MULTIPLES]
    if not texts:
        raise SchemaError(f"no {'integer' if integer else 'number'} multiple of {m!r} lies "
                          f"within the bounds at {path}/multipleOf")
    return _literals(texts)


def _float_multiple(value, m: float) -> bool:
    """Whether ``value`` is a multiple of the float ``m`` as ``jsonschema`` decides it:
    ``int(q) == q`` for ``q = value / m``, and exact fractions when ``q`` overflows to
    infinity (``-1e308`` with ``multipleOf: 0.5``; ``int(inf)`` raised OverflowError)."""
    q = value / m
    try:
        return int(q) == q
    except OverflowError:
        return Fraction(value) % Fraction(m) == 0


def _signed(lo: int | None, hi: int | None, fraction: bool) -> str:
    """Integers (or decimals without exponent when ``fraction``) in ``[lo, hi]`` (``None``:
    unbounded): a non-negative branch and a ``-`` branch over magnitudes."""
    alts = []
    if hi is None or hi >= 0:
        alts.append(_magnitude(max(lo, 0) if lo is not None else 0, hi, fraction))
    if lo is None or lo < 0:
        m_lo = 0 if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        if not fraction:
            m_lo = max(m_lo, 1)   # no "-0" for integers
        if m_hi is None or m_lo <= m_hi:
            alts.append("-" + _magnitude(m_lo, m_hi, fraction))
    return "(?:" + "|".join(alts) + ")"


def _magnitude(lo: int, hi: int | None, fraction: bool) -> str:
    """Decimal magnitudes m with lo ≤ m ≤ hi (integers, or decimals ``n(.d+)?`` when
    ``fraction``: m ≥ lo iff its integer part n ≥ lo; m ≤ hi iff n < hi, or n = hi with
    only zeros after the point)."""
    if not fraction:
        return "(?:" + "|".join(_uint_range(lo, hi)) + ")"
    frac = r"(?:\.[0-9]+)?"
    if hi is None:
        return "(?:" + "|".join(_uint_range(lo, None)) + ")" + frac
    alts = [f"{hi}(?:\\.0+)?"]
    if lo <= hi - 1:
        alts.append("(?:" + "|".join(_uint_range(lo, hi - 1)) + ")" + frac)
    return "(?:" + "|".join(alts) + ")"


def _uint_range(lo: int, hi: int | None) -> list[str]:
    """Regex alternatives for the decimal integers in ``[lo, hi]`` (no leading zeros)."""
    out = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for d in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = min(top, 10 ** d - 1)
        if a <= b:
            out.extend(_same_length(str(a), str(b)))
    if hi is None:
        out.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return out


def _same_length(a: str, b: str) -> list[str]:
    n = len(a)
    if n == 1:
        return [a if a == b else f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + r for r in _same_length(a[1:], b[1:])]
    out = []
    first_lo, first_hi = int(a[0]), int(b[0])
    if a[1:] != "0" * (n - 1):
        out.extend(a[0] + r for r in _same_length(a[1:], "9" * (n - 1)))
        first_lo += 1
    tail = b[1:] != "9" * (n - 1)
    if tail:
        first_hi -= 1
    if first_lo <= first_hi:
        digit = str(first_lo) if first_lo == first_hi else f"[{first_lo}-{first_hi}]"
        out.append(f"{digit}[0-9]{{{n - 1}}}")
    if tail:
        out.extend(b[0] + r for r in _same_length("0" * (n - 1), b[1:]))
    return out


