"""Numbers as people write them in word-problem answers, read into one canonical string.

"1,000", "$1,000.00", "1000." and "1000" all read as "1000"; "-$5" and "-5" as "-5"; ".5" as "0.5".
Commas count only in thousands groups: digits joined by other commas ("1,0000", "3,4") are not read
as a number at all rather than read wrong. A minus is a sign only where it cannot be a hyphen or a
subtraction ("10-3" holds 10 and 3; "x = -3" holds -3).
Fractions ("3/4") are two numbers here: symbolic answers belong to the `math` verifier.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Optional

_NUMBER = re.compile(
    r"(?<![\w.,])(?P<sign>[-\u2212])?(?:\$\s?)?(?P<body>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?![\d,]*\d)"
)


def canonical(sign: Optional[str], body: str) -> str:
    d = Decimal(body.replace(",", ""))
    if sign:
        d = -d
    if d == d.to_integral_value():
        return str(int(d))  # "-0" -> "0", "5.00" -> "5"
    return format(d.normalize(), "f")  # "0.50" -> "0.5", never an exponent


def numbers_in(text: str) -> list[str]:
    """Every number in `text`, in order, canonical."""
    return [canonical(m["sign"], m["body"]) for m in _NUMBER.finditer(text)]


def as_number(text: str) -> Optional[str]:
    """`text` read as exactly one number (a trailing period and surrounding space allowed), or None."""
    s = text.strip().removesuffix(".").strip()
    m = _NUMBER.fullmatch(s)
    return canonical(m["sign"], m["body"]) if m else None
