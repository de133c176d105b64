"""The synthetic verifiable tasks: add two small numbers (the RL default), multiply two larger ones with a
calculator (the tool-using task).

add: each record is {"question": "<a>+<b>=", "answer": "<a+b>"}, a and b drawn uniformly from
[0, max_operand] by a seeded generator; the `exact_int` verifier scores a completion against "answer".
The bundled tokenizer writes every operand, sign and sum of the default range as one token each.

mul: each record is {"question": "<a>*<b>=", "answer": "<a*b>", "messages": [...]}, a and b of `digits`
digits each, a product no tiny model computes in its head. `messages` is the demonstration of the tool's
use: the question, an assistant turn that calls the bundled calculator on "<a>*<b>" in the tool-call format
GRPO's tool rollouts parse (align/rewards/tool_calls.py), the tool's result as a `tool` message, and the
assistant's answer, the result copied. `data=mul` trains on the demonstrations (SFT), `data=mul_prompts`
takes question and answer as GRPO's prompt and reference (docs/grpo.md#tools).

The files under align/data/assets/add/ and assets/mul/ are this module's output for the parameters in
`BUNDLED` and `BUNDLED_MUL` (tests/unit/data/test_prompts.py::test_the_bundled_task_is_the_generators_output
and tests/unit/data/test_mul_task.py regenerate them and compare bytes):

    python -m align.data.synthetic        # rewrite the bundled files
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path
from typing import Any

from align.rewards.calculator import calculator
from align.rewards.tool_calls import call_text

BUNDLED = {"train": dict(n=2000, max_operand=2, seed=0), "test": dict(n=200, max_operand=2, seed=1)}
"""Per split: how the bundled file was generated. Sums of 0..2 + 0..2 take five values, so a policy that
has not read the prompt scores at most 1/3 (always "2"): a higher reward needs the question."""
BUNDLED_MUL = {"train": dict(n=2000, digits=2, seed=0), "test": dict(n=200, digits=2, seed=1)}
"""Per split: how the bundled multiplication file was generated."""


def add_records(n: int, max_operand: int, seed: int) -> list[dict[str, str]]:
    """`n` addition problems with operands in [0, max_operand], a pure function of the arguments."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append({"question": f"{a}+{b}=", "answer": str(a + b)})
    return out


def mul_records(n: int, digits: int, seed: int) -> list[dict[str, Any]]:
    """`n` multiplication problems of two `digits`-digit operands with their demonstrations, a pure function
    of the arguments."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = (rng.randint(10 ** (digits - 1), 10 ** digits - 1) for _ in range(2))
        expression = f"{a}*{b}"
        result = calculator(expression)  # what the tool answers in a rollout, character for character
        question = f"{expression}="
        out.append({"question": question, "answer": str(a * b), "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": call_text("calculator", expression=expression)},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": result}]})
    return out


def bundled_add(split: str) -> Path:
    return Path(str(resources.files("align.data") / "assets" / "add" / f"{split}.jsonl"))


def bundled_mul(split: str) -> Path:
    return Path(str(resources.files("align.data") / "assets" / "mul" / f"{split}.jsonl"))


def render(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def main() -> None:
    for bundled, where, make in ((BUNDLED, bundled_add, add_records), (BUNDLED_MUL, bundled_mul, mul_records)):
        for split, params in bundled.items():
            path = where(split)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(make(**params)))
            print(f"{path}: {params['n']} records")


if __name__ == "__main__":
    main()
