"""Each verifier's VERSION pinned to its behaviour.

A verifier's outputs over a fixed probe set (hand-written completions x references, plus GSM8K golds
against their own and shuffled references) are hashed; PINS holds that fingerprint per identity (VERSION,
and for `math` the math-verify release). What it catches: a change of any verdict, extracted answer,
normalised reference or refusal on the probes without a VERSION bump; a bump without a new pin.
What it cannot catch: a change no probe shows (add a probe when a fix needs one), or a pin rewritten
in place for an existing version. Re-pin in place only when the probe set itself changes, never
together with a change under align/rewards; otherwise bump VERSION and add a pin, keeping the old ones.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from align.rewards import VERIFIERS, BadReference
from tests.unit.rewards.conftest import derangement, gsm8k_answers

COMPLETIONS = [
    "", "no answer", "#### 18", "so 18 dollars.\n#### 18", "#### $1,000.00", "The answer is 5.00",
    "The answer is 5.", "x = -3", "-$5", "\u22127", "10-3=7", "5 - 3", "1,0000", "3,4", "3, 4", "50%",
    "#### 7\nso 8", "#### seven\nso 7", "#### 18\nDone.", "####18", "3 + 4 = 7", "12.0", "7.5", ".5",
    "The answer is $\\boxed{\\frac{1}{2}}$", "so x = 3/4", "$\\boxed{\\sqrt{2}}$", "$\\boxed{x^2+2x+1}$",
    "$\\boxed{\\{1, 2, 3\\}}$", "1e5", "#### 114,200", "#### 18.", "#### -0", "#### 18 eggs", "US$5", "abc123",
    "<<16-3-4=9>>9 eggs\n#### 9", "It is 1234567.891", "#### 0.50\n", "work\n#### $1,000.00\n\n",
]
REFERENCES = [
    "18", "#### 18", "#### 1,000", "5", "-3", "-5", "7", "0.5", "\\frac34", "\\sqrt 2", "(x+1)^2",
    "#### five", "", "114200", "#### 18.", "$18.", "5.00", "#### $1,000.00", " 7 ", "\u22127", "7.5",
    "#### 5 or 6", "2\\pi",
]


def _outcome(v, completion: str, reference: str) -> list:
    try:
        s = v.score(completion, reference)
    except BadReference:
        return ["refused"]
    return [s.value, s.extracted, s.reference]


def fingerprint(v) -> str:
    golds = gsm8k_answers("test")[:200]
    perm = derangement(len(golds))
    pairs = [(c, r) for c in COMPLETIONS for r in REFERENCES]
    pairs += list(zip(golds, golds)) + [(g, golds[j]) for g, j in zip(golds, perm)]
    out = [_outcome(v, c, r) for c, r in pairs]
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16]


def pin_key(v) -> str:
    return ",".join(f"{k}={val}" for k, val in v.identity().items() if k != "name")


PINS = {
    "exact_int": {"version=1": "786aeb780d8f9186"},
    "format": {"version=1": "139b3973550f4cb4"},
    "gsm8k": {"version=1": "d3843fabc97c4bad"},
    "math": {"version=1,math_verify=0.9.0": "5c682a6237fa1efe"},
}


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_behaviour_is_pinned_to_the_version(name):
    v = VERIFIERS[name]
    key, got = pin_key(v), fingerprint(v)
    pins = PINS.get(name, {})
    assert key in pins, f"{name}: nothing pinned for {key}: add PINS[{name!r}][{key!r}] = {got!r}"
    assert pins[key] == got, (
        f"{name}: behaviour changed under {key} (fingerprint {got}, pinned {pins[key]}): bump "
        f"{type(v).__name__}.VERSION and pin {got!r} under the new version, keeping the old pins"
    )
