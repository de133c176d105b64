"""An integer answer: the last number of the completion equals the integer reference exactly.

For tasks whose answer is a bare integer (the embedded RL task adds two small numbers): no "####"
convention, so "3 + 4 = 7" is read as 7, and "7.5" never equals 7."""

from __future__ import annotations

import re

from align.rewards.numbers import numbers_in
from align.rewards.verifier import BadReference, Score, Verifier

_INT = re.compile(r"\s*[-\u2212]?\d+\s*")


class ExactInt(Verifier):
    name = "exact_int"
    VERSION = 1

    def normalize_reference(self, reference: str) -> str:
        if not _INT.fullmatch(reference):
            raise BadReference(f"exact_int reference is not an integer: {reference.strip()[:80]!r}")
        return str(int(reference.strip().replace("\u2212", "-")))

    def score(self, completion: str, reference: str) -> Score:
        ref = self.normalize_reference(reference)
        found = numbers_in(completion)
        got = found[-1] if found else None
        return Score(value=float(got == ref), extracted=got, reference=ref)
