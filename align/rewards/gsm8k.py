"""GSM8K final answers: the number after "####", else the last number; exact match after normalisation."""

from __future__ import annotations

import re
from typing import Optional

from align.rewards.numbers import as_number, numbers_in
from align.rewards.verifier import BadReference, Score, Verifier

_MARKER = re.compile(r"####[ \t]*([^\n]*)")


def marked_answer(text: str) -> Optional[str]:
    """The first number on the last "####" line that holds one."""
    for m in reversed(list(_MARKER.finditer(text))):
        found = numbers_in(m.group(1))
        if found:
            return found[0]
    return None


def final_answer(text: str) -> Optional[str]:
    """A completion's answer: the "####" answer when there is one (a model that keeps generating after
    it does not lose its answer), else the last number in the text."""
    marked = marked_answer(text)
    if marked is not None:
        return marked
    found = numbers_in(text)
    return found[-1] if found else None


class Gsm8k(Verifier):
    name = "gsm8k"
    VERSION = 1

    def normalize_reference(self, reference: str) -> str:
        """A GSM8K answer field (the text after its last "####" is one number) or a bare number."""
        tail = reference.rsplit("####", 1)[-1]
        got = as_number(tail)
        if got is None:
            where = 'after "####"' if "####" in reference else "as a whole (no \"####\")"
            raise BadReference(f'gsm8k reference is not one number {where}: {tail.strip()[:80]!r}')
        return got

    def score(self, completion: str, reference: str) -> Score:
        ref = self.normalize_reference(reference)
        got = final_answer(completion)
        return Score(value=float(got == ref), extracted=got, reference=ref)
