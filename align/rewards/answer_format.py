"""The format check: the completion ends on a "#### <number>" line, the answer format that the bundled
GSM8K data teaches. It ignores the reference, so it rewards the form of an answer, never its value."""

from __future__ import annotations

import re

from align.rewards.numbers import as_number
from align.rewards.verifier import Score, Verifier

_ANSWER_LINE = re.compile(r"####[ \t]*(.*)")


class AnswerFormat(Verifier):
    name = "format"
    VERSION = 1

    def normalize_reference(self, reference: str) -> str:
        return ""  # no reference is read, so none can be refused

    def score(self, completion: str, reference: str) -> Score:
        lines = [ln.strip() for ln in completion.splitlines() if ln.strip()]
        m = _ANSWER_LINE.fullmatch(lines[-1]) if lines else None
        got = as_number(m.group(1)) if m else None
        return Score(value=float(got is not None), extracted=got, reference="")
