"""GRPO with the calculator learns, through the real engine (CPU, in-process, align's own decode loop): a
tiny model tuned on the bundled multiplication task's demonstrations (data=mul) copies the question into a
calculator call and the tool's result into its answer; tuned a few steps more on the mixture in which half
the answers are guesses (data=mul_mix), it calls the calculator on some questions only. GRPO with
objective.max_turns=2 and the calculator on questions it has not seen (data=mul_prompts, test split,
reward=exact_int) then learns to call it: the calls rise to nearly every trajectory, and the reward with
them. A two-digit product is out of the tiny model's reach: given no result by the tool, it scores nothing
(docs/grpo.md#tools)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import build_trainer, bundled_tokenizer

CPU = ["trainer.device=cpu", "trainer.export=false", "optimizer.warmup_ratio=0", "data.encode_workers=0"]
SFT = ["objective=sft", "sampler=shuffle", "sampler.micro_batch_size=16", "data.max_records=2000", *CPU]
GRPO = ["objective=grpo", "data=mul_prompts", "data.split=test", "objective.max_turns=2",
        "objective.tools=[align.rewards.calculator:calculator]", "objective.max_new_tokens=64",
        "objective.prompts_per_rollout=16", "objective.group_size=4", "optimizer.lr=5e-4",
        "optimizer.schedule=constant", "trainer.max_steps=12", *CPU]
COPIED = 0.05
"""Mean SFT loss per token under which the demonstrations' copies (the operands into the call, the result
into the answer) are learned; the call's boilerplate is learned long before. Copying is learned abruptly, at
a step that varies with the seed, so the warm start trains until it is (at most 400 steps)."""


def _save(trainer, d: Path) -> Path:
    trainer.model.save_pretrained(d)
    bundled_tokenizer().save_pretrained(d)
    return d


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _warm_start(tmp_path: Path) -> Path:
    demos = build_trainer(tmp_path / "demos", *SFT, "data=mul", "optimizer.lr=3e-3", "optimizer.schedule=constant",
                          "trainer.max_steps=400")
    batches, losses = iter(demos.stream), []
    while len(losses) < 400 and (len(losses) < 25 or _mean(losses[-25:]) > COPIED):
        losses.append(demos.train_step(batches)[0]["loss"])
    assert _mean(losses[-25:]) <= COPIED, losses[::25]
    mix = build_trainer(tmp_path / "mix", *SFT, "data=mul_mix", f"model.pretrained={_save(demos, tmp_path / 'w1')}",
                        "trainer.max_steps=30", "optimizer.lr=1e-3")
    batches = iter(mix.stream)
    for _ in range(30):
        mix.train_step(batches)
    return _save(mix, tmp_path / "w2")


@pytest.mark.slow
def test_grpo_learns_to_call_the_calculator_from_an_sft_warm_start(tmp_path):
    grpo = build_trainer(tmp_path / "grpo", *GRPO, f"model.pretrained={_warm_start(tmp_path)}")
    assert grpo.objective.engine.describe()["backend"] == "align"  # the real engine, not a script
    batches = iter(grpo.stream)
    rows = [grpo.train_step(batches)[0] for _ in range(12)]
    reward = [r["reward/mean"] for r in rows]
    calls = [r["rollout/tool_calls_mean"] for r in rows]
    # the warm start calls the calculator on some questions; GRPO makes it call on (nearly) all
    assert calls[0] < 0.75 and _mean(calls[-6:]) > 0.9, calls
    # and the reward rises with the calls: the answers come from the tool's results
    assert _mean(reward[-6:]) > max(1.5 * reward[0], reward[0] + 0.15), reward
