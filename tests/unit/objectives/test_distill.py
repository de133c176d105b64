"""objective=distill in a trainer built in-process (tiny student and teacher, the bundled addition prompts,
CPU): the loss that runs is TRL's on the rollout's own logits and masks the prompts out, the step-0 gate
catches a loss other than the one configured, the manifest names the teacher, a resume against another
teacher is refused, the plan counts the teacher's weights, and preflight refuses a teacher of another
tokenizer or vocabulary."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from align.data.collate import IGNORE
from tests.conftest import build_trainer, bundled_tokenizer
from tests.unit.objectives.conftest import teacher_checkpoint

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SMALL = ["objective=distill", "objective.group_size=2", "objective.prompts_per_rollout=4", "trainer.max_steps=2",
         "trainer.export=false", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return teacher_checkpoint(tmp_path_factory.mktemp("teacher") / "ckpt")


@pytest.fixture(scope="module")
def ran(tmp_path_factory, teacher):
    from align.run.resolved import check_objective

    trainer = build_trainer(tmp_path_factory.mktemp("distill"), *SMALL, f"objective.teacher={teacher}")
    record = check_objective(trainer)
    batches = iter(trainer.stream)
    rows = [trainer.train_step(batches)[0] for _ in range(2)]
    return trainer, record, rows


def _rollout_batch(trainer):
    obj = trainer.objective
    return obj._batch(np.arange(obj.rollout.size), with_old=False)


def test_the_loss_is_trls_generalized_jsd_on_the_rollouts_logits_and_skips_the_prompts(ran):
    from trl.experimental.gkd import GKDTrainer

    trainer, _, rows = ran
    obj, b = trainer.objective, _rollout_batch(trainer)
    with torch.no_grad():
        mine = obj.micro_loss(trainer.forward, b) / obj.weight(b)
        s = trainer.forward(b.model_inputs())
        t = trainer.forward(b.model_inputs(), module=obj.teacher)
    want = GKDTrainer.generalized_jsd_loss(s.float(), t.float(), labels=b.labels, beta=1.0)
    assert torch.allclose(mine, want, atol=1e-5, rtol=0), (mine.item(), want.item())
    # only the sampled completion tokens are in the loss: every one of them, no prompt token
    r = obj.rollout
    assert obj.weight(b) == int(r.completion_lens.sum()) == int((b.labels != IGNORE).sum())
    assert rows[0]["loss_tokens"] == rows[0]["rollout/tokens"] and rows[0]["loss"] > 0
    assert abs(rows[0]["loss"] - rows[0]["distill/divergence"]) < 1e-6
    assert rows[0]["mismatch/logp_abs_max"] < 1e-4  # fp32 CPU, shared weights: the engine sampled the student


def test_the_gate_passes_and_records_itself(ran):
    _, record, _ = ran
    gate = record["loss"]["gate"]
    assert gate["ok"] and gate["loss_at_teacher_eq_student_max"] == 0.0 and gate["grad_at_self_max"] < 1e-6
    assert gate["loss_mean"] > 0.01 and gate["loss_max_rel_error"] < 1e-5  # a teacher of another init


def _forward_kl(student, teacher, beta, temperature=1.0):
    from align.objectives.distill_loss import token_divergence

    return token_divergence(student, teacher, 0.0, temperature)


@pytest.mark.parametrize("break_it", ["direction", "beta", "temperature"])
def test_the_gate_refuses_a_loss_other_than_the_configured_one(ran, monkeypatch, break_it):
    import align.objectives.distill as distill
    from align.objectives.gate import GateError

    trainer, _, _ = ran
    obj = trainer.objective
    if break_it == "direction":
        monkeypatch.setattr(distill, "token_divergence", _forward_kl)
    elif break_it == "beta":
        monkeypatch.setattr(obj, "beta", 0.5)
    else:
        monkeypatch.setattr(obj, "loss_args", lambda: {"beta": 1.0, "temperature": 2.0})
    with pytest.raises(GateError, match="the loss that runs is not the loss configured"):
        obj.gate(trainer.stream.peek())


def test_a_teacher_equal_to_the_student_gives_zero_loss_and_gradient(ran):
    from align.objectives.distill import gate_check

    trainer, _, _ = ran
    obj = trainer.objective
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    rep = gate_check(logits, logits, obj.loss_args(), obj.cfg)
    assert rep["ok"] and rep["loss_mean"] == 0.0 and rep["grad_max_abs_error"] < 1e-6


def test_the_manifest_names_the_teacher_loss_and_engine(ran, teacher):
    from align.core.hashing import sha256_files
    from align.objectives.reference import weights_sha256

    trainer, _, _ = ran
    loss = trainer.model_info["loss"]
    assert loss["kind"] == "distill" and loss["loss"] == "reverse_kl" and loss["beta"] == 1.0
    assert loss["temperature"] == 1.0 and loss["engine"]["backend"] in ("align", "hf")
    t = loss["teacher"]
    assert t["path"] == str(teacher.resolve()) and t["weights_sha256"] == weights_sha256(trainer.objective.teacher)
    assert t["files_sha256"] == sha256_files([teacher / "model.safetensors"], teacher)
    assert t["params"] == sum(p.numel() for p in trainer.objective.teacher.parameters())


def test_a_resume_against_another_teacher_is_refused(ran):
    from align.errors import ConfigError

    trainer, _, _ = ran
    obj = trainer.objective
    state = obj.state_dict()
    assert state["rollouts"] == 2 and state["teacher_weights_sha256"] == obj.teacher_id["weights_sha256"]
    with pytest.raises(ConfigError, match="objective.teacher: the checkpoint was distilled from a teacher"):
        obj.load_state_dict({**state, "teacher_weights_sha256": "0" * 64})
    obj.load_state_dict(state)
    back = obj.rank_state_dict()["rollout"]
    assert back["index"] == 1 and back["served"] == 1


def test_the_plan_counts_the_teachers_own_weights(tmp_path, compose):
    """A teacher of another size: the memory estimate's reference term is ITS parameters, in the student's dtype."""
    from align.config import to_typed
    from align.objectives.teacher import teacher_params
    from align.plan.planner import plan

    big = teacher_checkpoint(tmp_path / "big", overrides={"num_hidden_layers": 4})
    est = plan(to_typed(compose(["objective=distill", f"objective.teacher={big}"])), torch.device("cpu")).estimate
    n = teacher_params(str(big))
    assert n > est.params.total and est.reference == n * 4


def _preflight(compose, *overrides):
    from align.config import to_typed
    from align.run.preflight_checks import collect

    report = collect(to_typed(compose(["objective=distill", "allow_dirty=true", *overrides])))
    return [c for c in report.checks if c.name == "objective=distill"]


def test_preflight_passes_a_teacher_with_the_students_tokenizer(compose, teacher):
    [c] = _preflight(compose, f"objective.teacher={teacher}")
    assert c.ok and "the student's tokenizer and vocabulary size (4096)" in c.detail


def test_preflight_refuses_a_missing_teacher(compose):
    [c] = _preflight(compose)
    assert not c.ok and c.key == "objective.teacher" and "needs a teacher" in c.detail


def test_preflight_refuses_a_teacher_of_another_tokenizer(compose, tmp_path):
    from align.config import ModelConfig
    from align.data.tokenizer import load_tokenizer

    d = teacher_checkpoint(tmp_path / "t")
    tok = load_tokenizer(ModelConfig())
    tok.add_tokens(["<extra_tok>"])
    tok.save_pretrained(d)
    [c] = _preflight(compose, f"objective.teacher={d}")
    assert not c.ok and c.key == "objective.teacher"
    assert "the teacher's tokenizer" in c.detail and "'<extra_tok>' (student None, teacher 4096)" in c.detail


def test_preflight_refuses_a_teacher_of_other_special_tokens(compose, tmp_path):
    from align.objectives.teacher import tokenizer_problem

    student = bundled_tokenizer()
    other = type(student).from_pretrained(str(teacher_checkpoint(tmp_path / "t")))
    vocab = student.get_vocab()
    other.pad_token = next(t for t in vocab if t not in (student.pad_token, student.eos_token, student.bos_token))
    other.save_pretrained(tmp_path / "t")
    assert "other special tokens" in tokenizer_problem(student, other, "t")
    [c] = _preflight(compose, f"objective.teacher={tmp_path / 't'}")
    assert not c.ok and "other special tokens: pad_token" in c.detail


def test_preflight_refuses_a_teacher_of_another_vocabulary_size(compose, tmp_path):
    d = teacher_checkpoint(tmp_path / "t", overrides={"vocab_size": 4104})
    [c] = _preflight(compose, f"objective.teacher={d}")
    assert not c.ok and "the teacher's vocabulary size is 4104" in c.detail and "the student's 4096" in c.detail
