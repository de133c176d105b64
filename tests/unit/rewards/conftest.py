"""The bundled GSM8K answers as gold completions, and shuffles that pair each with another question's
reference: the two ways every verifier is tested (gold must score 100%, shuffled must score chance)."""

from __future__ import annotations

import json
import random

import pytest

from align.data.sources import bundled_gsm8k


def gsm8k_answers(split: str) -> list[str]:
    with bundled_gsm8k(split).open() as f:
        return [json.loads(line)["answer"] for line in f]


def plain_final(answer: str) -> str:
    """The reference number read without align's code (the chance rate must not trust what it tests)."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def derangement(n: int, seed: int = 0) -> list[int]:
    """A permutation with no fixed point: every completion meets another question's reference."""
    rng = random.Random(seed)
    while True:
        p = list(range(n))
        rng.shuffle(p)
        if all(i != j for i, j in enumerate(p)):
            return p


def chance(refs: list[str], perm: list[int]) -> float:
    """The rate at which a shuffled pair's references are equal anyway: what a perfect verifier scores."""
    return sum(refs[i] == refs[j] for i, j in enumerate(perm)) / len(refs)


def rate(verifier, completions: list[str], references: list[str]) -> float:
    return sum(verifier.score(c, r).value for c, r in zip(completions, references)) / len(completions)


@pytest.fixture(scope="session")
def gsm8k_test() -> list[str]:
    return gsm8k_answers("test")


@pytest.fixture(scope="session")
def gsm8k_all() -> list[str]:
    return gsm8k_answers("train") + gsm8k_answers("test")


RM_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} says: {{ m['content'] }}\n{% endfor %}"
               "{{ eos_token }}")
"""A chat template other than the bundled tokenizer's: a reward model's texts must be rendered through its own."""


def reward_model_checkpoint(d, num_labels: int = 1, template: str | None = RM_TEMPLATE, seed: int = 1):
    """A tiny reward model at `d`, as objective=reward_model exports one: the tiny mistral preset's backbone
    (random init under `seed`) under its AutoModelForSequenceClassification class (align/models/scalar_head.py),
    `save_pretrained`, and the bundled tokenizer beside it with the chat template `template` (None: none).
    `num_labels` other than 1 rewrites config.json only (for the checks that read no weight)."""
    import json

    from transformers import AutoTokenizer

    from align.config import ModelConfig
    from align.data.tokenizer import bundled_tokenizer_dir
    from align.models.family import family_spec
    from align.models.scalar_head import to_scalar_head
    from tests.conftest import build_tiny

    tok = AutoTokenizer.from_pretrained(str(bundled_tokenizer_dir()))
    to_scalar_head(build_tiny(seed=seed).model, family_spec(ModelConfig()), tok.pad_token_id).save_pretrained(d)
    tok.chat_template = template
    tok.save_pretrained(d)
    if template is None:
        (d / "chat_template.jinja").unlink(missing_ok=True)
    if num_labels != 1:
        config = json.loads((d / "config.json").read_text())
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
        (d / "config.json").write_text(json.dumps(config))
    return d
