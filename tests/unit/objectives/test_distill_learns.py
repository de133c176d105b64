"""objective=distill learns (CPU, in-process): a tiny teacher trained for a few SFT steps on the bundled
addition task, then a student of another init distilled from it; the student's per-token reverse KL to the
teacher, measured on its own fresh samples (each step's loss is on a rollout sampled before that step's
update), drops clearly."""

from __future__ import annotations

import pytest

from tests.conftest import build_trainer, bundled_tokenizer

LR = ["optimizer.lr=1e-2", "optimizer.warmup_ratio=0", "trainer.device=cpu", "trainer.export=false"]


def _run(trainer, steps: int) -> list[dict]:
    batches = iter(trainer.stream)
    return [trainer.train_step(batches)[0] for _ in range(steps)]


@pytest.mark.slow
def test_a_student_approaches_a_trained_teacher(tmp_path):
    sft = build_trainer(tmp_path / "sft", "objective=sft", "data=add", "sampler=shuffle", "sampler.micro_batch_size=32",
                        "trainer.max_steps=25", *LR)
    sft_rows = _run(sft, 25)
    assert sft_rows[-1]["loss"] < 0.5 * sft_rows[0]["loss"]  # the teacher has learned something of the task
    sft.model.save_pretrained(tmp_path / "teacher")
    bundled_tokenizer().save_pretrained(tmp_path / "teacher")

    student = build_trainer(tmp_path / "distill", "objective=distill", f"objective.teacher={tmp_path / 'teacher'}",
                            "trainer.seed=5", "objective.prompts_per_rollout=16", "objective.group_size=2",
                            "trainer.max_steps=20", *LR)
    rows = _run(student, 20)
    kl = [r["distill/divergence"] for r in rows]
    first, last = sum(kl[:3]) / 3, sum(kl[-4:]) / 4
    assert last < 0.7 * first, kl
    # the student's samples became likelier under the teacher
    assert sum(r["distill/teacher_logp"] for r in rows[-4:]) / 4 > sum(r["distill/teacher_logp"] for r in rows[:3]) / 3
