"""Mathematical answers through HF math-verify: LaTeX (\\boxed{...}) or plain expressions, compared
symbolically (1/2 == 0.5 == \\frac{1}{2}).

A completion or reference with a "####" line is read from its last one (the GSM8K convention, which
math-verify does not know: it would read the last expression of the worked solution instead).

math-verify bounds parsing and comparison with SIGALRM, which only the main thread may arm, and its
wrapper cancels whatever alarm the process had pending. So the library's timeout is used only on the
main thread with no alarm pending; anywhere else it runs unbounded (it would raise ValueError off the
main thread), and bounding time there is the caller's business.
"""

from __future__ import annotations

import re
import signal
import threading
from functools import lru_cache
from importlib.metadata import version
from typing import Any, Optional

from align.rewards.verifier import BadReference, Score, Verifier

_TIMEOUT_S = 5  # math-verify's own default for one parse and for one comparison
_MARKED = re.compile(r"####[ \t]*([^\n]*)")
_MATH_MODE = ("$", "\\(", "\\[", "\\boxed")


def _timeout() -> Optional[int]:
    main = threading.current_thread() is threading.main_thread()
    return _TIMEOUT_S if main and signal.getitimer(signal.ITIMER_REAL)[0] == 0 else None


def _span(text: str) -> str:
    marked = _MARKED.findall(text)
    return marked[-1] if marked else text


def _shown(parsed: list) -> Optional[str]:
    return str(parsed[0]) if parsed else None


class MathAnswer(Verifier):
    name = "math"
    VERSION = 1

    def identity(self) -> dict[str, Any]:
        # Verdicts are math-verify's: another release may judge the same pair differently.
        return {**super().identity(), "math_verify": version("math-verify")}

    @staticmethod
    @lru_cache(maxsize=4096)  # RL scores a group of completions against one reference; a raise is not cached
    def _gold(reference: str) -> tuple:
        from math_verify import parse

        ref = _span(reference).strip()
        # A bare reference is LaTeX content ("\frac{1}{2}"): in math mode it parses as LaTeX, not as text.
        text = ref if any(t in ref for t in _MATH_MODE) else f"${ref}$"
        gold = parse(text, parsing_timeout=_timeout())
        if not gold:
            raise BadReference(f"math reference has no expression math-verify can read: {ref[:80]!r}")
        return tuple(gold)  # sympy objects are immutable: sharing them across calls is safe

    def normalize_reference(self, reference: str) -> str:
        return str(self._gold(reference)[0])

    def score(self, completion: str, reference: str) -> Score:
        from math_verify import parse, verify

        gold = self._gold(reference)
        t = _timeout()
        pred = parse(_span(completion), parsing_timeout=t)
        ok = bool(pred) and verify(list(gold), pred, timeout_seconds=t)
        return Score(value=float(ok), extracted=_shown(pred), reference=str(gold[0]))
