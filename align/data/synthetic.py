"""The synthetic verifiable task the RL default learns: add two small numbers.

Each record is {"question": "<a>+<b>=", "answer": "<a+b>"}, a and b drawn uniformly from
[0, max_operand] by a seeded generator; the `exact_int` verifier scores a completion against "answer".
The bundled tokenizer writes every operand, sign and sum of the default range as one token each.

The files under align/data/assets/add/ are this module's output for the parameters in `BUNDLED`
(tests/unit/data/test_prompts.py::test_the_bundled_task_is_the_generators_output regenerates them and
compares bytes):

    python -m align.data.synthetic        # rewrite the bundled files
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

BUNDLED = {"train": dict(n=2000, max_operand=2, seed=0), "test": dict(n=200, max_operand=2, seed=1)}
"""Per split: how the bundled file was generated. Sums of 0..2 + 0..2 take five values, so a policy that
has not read the prompt scores at most 1/3 (always "2"): a higher reward needs the question."""


def add_records(n: int, max_operand: int, seed: int) -> list[dict[str, str]]:
    """`n` addition problems with operands in [0, max_operand], a pure function of the arguments."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append({"question": f"{a}+{b}=", "answer": str(a + b)})
    return out


def bundled_add(split: str) -> Path:
    return Path(str(resources.files("align.data") / "assets" / "add" / f"{split}.jsonl"))


def render(records: list[dict[str, str]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def main() -> None:
    for split, params in BUNDLED.items():
        path = bundled_add(split)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(add_records(**params)))
        print(f"{path}: {params['n']} records")


if __name__ == "__main__":
    main()
