"""GRPO's options end to end in an in-process trainer: KL to a frozen reference (k3), DAPO's dynamic
sampling, GSPO's sequence ratio, truncated importance sampling, several updates per rollout."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.conftest import build_trainer
from tests.grpo_rewards import FlatOn, LengthParity

SMALL = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.max_steps=4",
         "trainer.export=false", "trainer.device=cpu"]


def _steps(trainer, n: int, batches=None) -> list[dict]:
    batches = batches if batches is not None else iter(trainer.stream)
    return [trainer.train_step(batches)[0] for _ in range(n)]


def test_kl_to_a_frozen_copy_of_the_start_is_zero_first_then_grows_and_the_copy_never_trains(tmp_path):
    trainer = build_trainer(tmp_path, *SMALL, "objective.kl_coef=0.1")
    obj = trainer.objective
    obj.reward = LengthParity()
    ref = obj.reference.module
    before = copy.deepcopy(ref.state_dict())
    rows = _steps(trainer, 3)
    assert rows[0]["kl/ref_mean"] == 0.0  # the policy is its reference before the first update
    assert rows[2]["kl/ref_mean"] > 0 and rows[2]["time/reference_s"] > 0
    assert all(torch.equal(before[k], v) for k, v in ref.state_dict().items())
    assert not any(p.requires_grad for p in ref.parameters())
    kl = trainer.model_info["loss"]["kl"]
    assert kl["estimator"] == "k3" and kl["reference"] == "model" and len(kl["reference_sha256"]) == 64


def test_dynamic_sampling_replaces_groups_without_signal(tmp_path):
    """Prompts whose answer is "2" never score (their groups have no signal): dynamic sampling draws
    further prompt batches and swaps those groups for ones with signal."""
    trainer = build_trainer(tmp_path, *SMALL, "objective.dynamic_sampling=true", "objective.dynamic_sampling_rounds=4")
    obj = trainer.objective
    obj.reward = FlatOn("2")
    batches = iter(trainer.stream)
    row = _steps(trainer, 1, batches)[0]
    r = obj.rollout
    refs = [obj.prompts.references[i] for i in r.rows[::4]]
    assert row["reward/zero_variance_first_round"] > 0, "a rollout where no group needed replacing proves nothing"
    assert row["rollout/rounds"] > 1 and trainer.stream.position.index == row["rollout/rounds"]
    assert row["reward/zero_variance_frac"] < row["reward/zero_variance_first_round"]
    if row["reward/zero_variance_frac"] == 0:
        assert "2" not in refs


def test_without_dynamic_sampling_flat_groups_stay_and_are_counted(tmp_path):
    trainer = build_trainer(tmp_path, *SMALL)
    trainer.objective.reward = FlatOn("2")
    row = _steps(trainer, 1)[0]
    assert row["rollout/rounds"] == 1 and trainer.stream.position.index == 1
    assert row["reward/zero_variance_frac"] == row["reward/zero_variance_first_round"] > 0


def test_several_updates_per_rollout_recompute_old_log_probs_once_and_replay(tmp_path):
    trainer = build_trainer(tmp_path, *SMALL, "objective.updates_per_rollout=2", "trainer.grad_accum=2")
    trainer.objective.reward = LengthParity()
    rows = _steps(trainer, 4)
    assert [r.get("rollout/index") for r in rows] == [0, None, 1, None]
    assert rows[0]["time/old_logps_s"] > 0 and rows[1]["time/old_logps_s"] == 0
    assert rows[0]["mismatch/logp_abs_max"] < 1e-4 and "mismatch/logp_abs_max" not in rows[1]
    # the second update of a rollout is off-policy by one step: its ratio moved off 1
    assert rows[1]["policy/ratio_mean"] != 1.0
    assert trainer.model_info["loss"]["old_logps"].startswith("a no-grad trainer pass")


def test_gspo_and_tis_run_and_say_so(tmp_path):
    trainer = build_trainer(tmp_path, *SMALL, "objective.ratio_level=sequence", "objective.is_correction=tis",
                            "objective.generation_dtype=bf16", "objective.is_cap=1.0")
    obj = trainer.objective
    obj.reward = LengthParity()
    row = _steps(trainer, 1)[0]
    loss = trainer.model_info["loss"]
    assert (loss["ratio_level"], loss["is_correction"], loss["is_cap"]) == ("sequence", "tis", 1.0)
    assert row["mismatch/is_over_cap_frac"] > 0  # bf16 generation: some tokens' ratio exceeds the cap
    # the TIS weight is applied: the same micro-batch's loss differs without it
    b = obj._batch(obj.rollout.parts[0][0], with_old=False)
    with torch.no_grad():
        with_tis = obj.micro_loss(trainer.forward, b)
        obj.cfg.is_correction = type(obj.cfg.is_correction)("none")
        without = obj.micro_loss(trainer.forward, b)
    assert with_tis != without
    assert np.isfinite(row["loss"])


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "seq_mean_token_sum"])
def test_per_sequence_aggregations_weigh_by_completions(tmp_path, agg):
    trainer = build_trainer(tmp_path, *SMALL, f"objective.loss_agg={agg}", "trainer.max_steps=1")
    obj = trainer.objective
    window = obj.next_window(iter(trainer.stream), 1, trainer.env.device)
    assert obj.weight(window[0]) == window[0].n_seq == 16


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_moe_router_flip_rate_is_recorded_per_layer_and_sees_a_planted_mismatch(tmp_path, backend):
    """OLMoE, on either engine (auto: align's, which records each token's experts beside it; hf, whose calls
    are mapped back to rows): generation and training route the same tokens to the same experts in fp32
    (flip rate 0); the same comparison against the generation's picks shifted by one token (a wrong
    alignment) flips most tokens, so a rate of 0 is not an artefact of routers that pick the same experts
    everywhere; a bf16 generation copy flips some."""
    moe = [*SMALL, "model=olmoe", "trainer.max_steps=1", f"objective.generation_backend={backend}"]
    trainer = build_trainer(tmp_path / "fp32", *moe)
    assert trainer.objective.engine.backend.value == ("align" if backend == "auto" else "hf")
    row = _steps(trainer, 1)[0]
    assert row["router_flip/l0"] == 0 and row["router_flip/l1"] == 0 and row["router_flip/mean"] == 0
    assert trainer.model_info["loss"]["router_flip_rate"].startswith("per MoE layer")
    obj = trainer.objective
    r = obj.rollout
    r.router_topk = torch.roll(r.router_topk, shifts=1, dims=1)
    with torch.no_grad():
        obj._first_forward(trainer.forward, obj._batch(r.parts[0][0], with_old=False))
    assert obj.window_metrics()["router_flip/mean"] > 0.3

    trainer = build_trainer(tmp_path / "bf16", *moe, "objective.generation_dtype=bf16")
    row = _steps(trainer, 1)[0]
    assert row["mismatch/logp_abs_mean"] > 1e-3 and row["router_flip/mean"] > 0


class _CallsFirst:
    """The run's engine, except that each prompt's sample 0 calls the calculator on its first turn: that turn is
    scripted, with the routing a teacher-forced forward gives its tokens (what the engine records for tokens it
    samples); the turn after the tool message, and every other turn, is the engine's own."""

    def __init__(self, inner, tok, taps) -> None:
        self.inner, self.tok, self.taps = inner, tok, taps

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def generate(self, prompts, spec):
        from align.generation import Completion, FinishReason
        from tests.unit.generation.test_align_engine import _routed_by_a_teacher_forced_forward
        from tests.unit.objectives.test_grpo_tools import _call

        out = self.inner.generate(prompts, spec)
        for j, c in enumerate(out):
            prompt = list(prompts[c.prompt_index])
            if c.sample_index == 0 and "<|tool|>" not in self.tok.decode(prompt, skip_special_tokens=False):
                ids = tuple(self.tok(_call("2+3"), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
                routed = _routed_by_a_teacher_forced_forward(self.inner.model, self.taps, prompt, ids)
                out[j] = Completion(c.prompt_index, 0, ids, (-1.0,) * len(ids), (-1.0,) * len(ids), FinishReason.stop,
                                    routed)
        return out


def test_moe_router_flip_rate_over_tool_trajectories_reads_the_models_tokens_only(tmp_path):
    """Multi-turn on align's engine: a trajectory's routing record is its turns' records end to end, the tool
    message between them left out, aligned with the loss tokens. fp32 training routes every model token of
    trajectories that called the calculator as their turns were routed (rate 0); the record shifted by one
    token flips most, and one with the tool message's positions left in would misalign every later turn."""
    from align.models.family_table import FAMILIES
    from tests.unit.objectives.test_grpo_tools import CALC

    trainer = build_trainer(tmp_path, *SMALL, "model=olmoe", "trainer.max_steps=1", "objective.max_turns=2",
                            f"objective.tools=[{CALC}]", "objective.max_new_tokens=16", "data.max_seq_len=256")
    obj = trainer.objective
    assert obj.engine.backend.value == "align" and obj.router_train is not None
    obj.engine = _CallsFirst(obj.engine, trainer.tokenizer, FAMILIES["olmoe"].router_taps(obj.engine.model))
    row = _steps(trainer, 1)[0]
    r = obj.rollout
    assert row["rollout/tool_calls_mean"] >= 0.25 and row["rollout/turns_mean"] > 1
    assert r.router_topk.shape[1] == len(r.engine_logps) == int(r.loss_mask.sum())  # model tokens only
    assert row["router_flip/mean"] == 0
    r.router_topk = torch.roll(r.router_topk, shifts=1, dims=1)
    with torch.no_grad():
        obj._first_forward(trainer.forward, obj._batch(r.parts[0][0], with_old=False))
    assert obj.window_metrics()["router_flip/mean"] > 0.3


def test_dense_models_record_no_router_flip_rate(tmp_path):
    trainer = build_trainer(tmp_path, *SMALL, "trainer.max_steps=1")
    row = _steps(trainer, 1)[0]
    assert not any(k.startswith("router_flip") for k in row)
    assert trainer.model_info["loss"]["router_flip_rate"] is None
