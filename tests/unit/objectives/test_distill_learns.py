"""objective=distill learns (CPU, in-process): a tiny teacher trained by SFT on the bundled addition task,
then a student of another init distilled from it. The student's per-token divergence to the teacher,
measured on its own fresh samples (each step's loss is on a rollout sampled before that step's update),
drops clearly; and its accuracy on the task's held-out split (the bundled `add` test prompts, greedy,
scored by the `exact_int` verifier through align.evaluation.evaluate, the code of `python -m align.eval`)
rises from nothing to near the teacher's, reached in fewer steps than GRPO from the same start (the same
init, optimizer and step count; GRPO at its own sampling defaults, which draw more completions a step).

The distillation runs at `loss=jsd beta=0`, forward KL(teacher || student): the student starts by
answering every prompt alike, and reverse KL's gradient toward the right digit is weighted by the
student's own small probability of it, so it leaves that mode slowly; forward KL pulls the right digit up
at once. GRPO from a random init scores almost nothing at first and learns little in as many steps."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_trainer, bundled_tokenizer

OPT = ["optimizer.lr=3e-3", "optimizer.warmup_ratio=0", "trainer.device=cpu", "trainer.export=false"]
STEPS, EVERY = 40, 5
CLOSE = 0.75
"""The share of the teacher's accuracy a student must reach to count as having reached it."""


def _accuracy(trainer) -> float:
    """Greedy accuracy on the held-out addition prompts, as `python -m align.eval` scores it."""
    from align.config.eval_config import EvalConfig
    from align.data.synthetic import bundled_add
    from align.evaluation import evaluate

    cfg = EvalConfig(prompts=str(bundled_add("test")), verifier="exact_int", max_new_tokens=4)
    return evaluate(trainer.model, trainer.tokenizer, cfg, "cpu")["metrics"]["accuracy"]


def _train(trainer, steps: int, every: int = 0) -> tuple[list[dict], dict[int, float]]:
    """`steps` steps; the rows, and the accuracy before the first and after every `every`-th."""
    batches = iter(trainer.stream)
    rows, accuracy = [], {0: _accuracy(trainer)} if every else {}
    for step in range(1, steps + 1):
        rows.append(trainer.train_step(batches)[0])
        if every and step % every == 0:
            accuracy[step] = _accuracy(trainer)
    return rows, accuracy


def _reached(accuracy: dict[int, float], bar: float) -> float:
    """The first step whose accuracy is at least `bar` (inf: none)."""
    return min((s for s, a in accuracy.items() if a >= bar), default=float("inf"))


@pytest.mark.slow
def test_a_student_approaches_a_trained_teacher_sooner_than_grpo(tmp_path):
    sft = build_trainer(tmp_path / "sft", "objective=sft", "data=add", "sampler=shuffle", "sampler.micro_batch_size=32",
                        "trainer.max_steps=60", *OPT)
    sft_rows, _ = _train(sft, 60)
    assert sft_rows[-1]["loss"] < 0.5 * sft_rows[0]["loss"]
    teacher = _accuracy(sft)
    assert teacher >= 0.9, teacher  # a trained teacher: it answers the held-out prompts
    sft.model.save_pretrained(tmp_path / "teacher")
    bundled_tokenizer().save_pretrained(tmp_path / "teacher")

    start = ["trainer.seed=5", f"trainer.max_steps={STEPS}", "optimizer.schedule=constant", *OPT]
    student = build_trainer(tmp_path / "distill", "objective=distill", f"objective.teacher={tmp_path / 'teacher'}",
                            "objective.loss=jsd", "objective.beta=0", "objective.prompts_per_rollout=16",
                            "objective.group_size=2", *start)
    grpo = build_trainer(tmp_path / "grpo", "objective=grpo", *start)
    a, b = student.model.state_dict(), grpo.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same start

    rows, distilled = _train(student, STEPS, EVERY)
    kl = [r["distill/divergence"] for r in rows]
    first, last = sum(kl[:3]) / 3, sum(kl[-4:]) / 4
    assert last < 0.7 * first, kl
    # the student's samples became likelier under the teacher
    assert sum(r["distill/teacher_logp"] for r in rows[-4:]) / 4 > sum(r["distill/teacher_logp"] for r in rows[:3]) / 3

    _, rl = _train(grpo, STEPS, EVERY)
    report = {"teacher": teacher, "distill": distilled, "grpo": rl}
    assert distilled[0] == rl[0] <= 0.1, report  # the student before: it cannot add
    bar = CLOSE * teacher
    assert _reached(distilled, bar) < _reached(rl, bar), report  # near the teacher, and sooner than GRPO
    assert distilled[STEPS] > rl[STEPS], report
