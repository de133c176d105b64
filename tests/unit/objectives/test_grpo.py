"""The GRPO objective in a trainer built in-process (tiny model, the bundled addition task, CPU): what a
rollout holds, what the step's row reports, the trainer-vs-engine check (a planted dtype mismatch shows),
the weight hand-off check (a stale sync stops the run), packed micro-batches, and the checkpointed buffer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import build_trainer

SMALL = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.max_steps=2",
         "trainer.export=false", "trainer.device=cpu"]


def _steps(trainer, n: int) -> list[dict]:
    batches = iter(trainer.stream)
    rows = []
    for _ in range(n):
        metrics, _ = trainer.train_step(batches)
        rows.append(metrics)
    return rows


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    trainer = build_trainer(tmp_path_factory.mktemp("grpo"), *SMALL)
    return trainer, _steps(trainer, 2)


def test_a_step_reports_reward_mismatch_and_where_the_time_went(ran):
    trainer, rows = ran
    row = rows[0]
    for key in ("reward/mean", "reward/exact_int", "reward/zero_variance_frac", "rollout/tokens",
                "rollout/tokens_per_s",
                "mismatch/logp_abs_mean", "mismatch/logp_abs_max", "mismatch/kl", "mismatch/is_ratio_std",
                "mismatch/is_ratio_min", "mismatch/is_ratio_max", "time/generation_s", "time/scoring_s",
                "time/update_s", "time/generation_share", "time/update_tokens_per_s", "policy/clip_frac"):
        assert key in row, key
    assert 0 < row["time/generation_share"] < 1
    assert row["rollout/sequences"] == 16 and row["rollout/index"] == 0 and rows[1]["rollout/index"] == 1
    # fp32 on CPU, the same weights: the engine's log-probs are the trainer's up to summation order
    assert row["mismatch/logp_abs_max"] < 1e-4
    assert row["loss_tokens"] == row["rollout/tokens"]  # every completion token is a loss token, prompts none


def test_the_rollouts_rewards_are_the_verifiers_scores_of_its_completions(ran):
    trainer, _ = ran
    obj = trainer.objective
    r = obj.rollout
    tok = trainer.tokenizer
    for s in range(r.size):
        a, b = r.offsets[s] + r.prompt_lens[s], r.offsets[s + 1]
        text = tok.decode(r.tokens[a:b].tolist(), skip_special_tokens=True)
        numbers = [w for w in "".join(c if c.isdigit() else " " for c in text).split()]
        ref = obj.prompts.references[r.rows[s]]
        question = tok.decode(r.tokens[r.offsets[s]:a].tolist(), skip_special_tokens=True)
        x, y = question.rstrip("=").split("+")
        assert ref == str(int(x) + int(y))
        assert r.rewards[s] == float(bool(numbers) and numbers[-1] == ref) or "-" in text or "." in text


def test_manifest_record_names_the_loss_and_the_correction(ran):
    trainer, _ = ran
    loss = trainer.model_info["loss"]
    assert loss["kind"] == "grpo" and loss["is_correction"] == "none" and loss["advantage"] == "grpo"
    assert loss["engine"]["weights"].startswith("shared")
    assert loss["reward"]["weights"] == {"exact_int": 1.0}


def test_the_buffer_survives_a_checkpoint_round_trip(ran):
    from align.objectives.rollout import Rollout

    trainer, _ = ran
    r = trainer.objective.rollout
    back = Rollout.from_state_dict(r.state_dict())
    for k in Rollout._ARRAYS:
        assert np.array_equal(getattr(back, k), getattr(r, k)) and getattr(back, k).dtype == getattr(r, k).dtype, k
    assert back.served == r.served
    assert [p.tolist() for s in back.parts for p in s] == [p.tolist() for s in r.parts for p in s]


def test_packed_micro_batches_give_each_completion_its_own_log_probs(tmp_path):
    """sampler.packed: one row, positions restarting per sequence: every token's log-prob equals that of
    its sequence forwarded alone (documents never attend to each other)."""
    trainer = build_trainer(tmp_path, *SMALL, "sampler.packed=true")
    _steps(trainer, 1)
    obj = trainer.objective
    seqs = obj.rollout.parts[0][0]
    packed = obj._batch(seqs, with_old=False)
    assert packed.input_ids.shape[0] == 1 and packed.attention_mask is None and packed.position_ids is not None
    with torch.no_grad():
        together = obj.target_logps(trainer.forward, packed)
        alone = torch.cat([obj.target_logps(trainer.forward, obj._batch(np.array([s]), with_old=False)) for s in seqs])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


def test_a_planted_dtype_mismatch_is_reported_and_the_copy_is_hash_checked(tmp_path):
    """Generation from a bf16 copy while training in fp32: the rollout record shows the gap (and the
    hash of the weights the engine used); the same run with shared weights shows none."""
    trainer = build_trainer(tmp_path, *SMALL, "objective.generation_dtype=bf16")
    row = _steps(trainer, 1)[0]
    assert row["mismatch/logp_abs_mean"] > 1e-3, row["mismatch/logp_abs_mean"]
    assert row["mismatch/kl"] > 0 and row["mismatch/is_ratio_std"] > 1e-3
    assert row["time/sync_s"] > 0
    assert row["rollout/weights_sha256"] == trainer.objective.engine.weights_hash()
    assert trainer.model_info["loss"]["engine"]["weights"].startswith("copy")


def test_a_stale_weight_sync_stops_the_run(tmp_path):
    from align.objectives.grpo_rollouts import StaleWeights

    trainer = build_trainer(tmp_path, *SMALL, "objective.generation_dtype=fp32")
    engine = trainer.objective.engine
    batches = iter(trainer.stream)
    trainer.train_step(batches)
    with torch.no_grad():  # an update moved the training weights (the first rollout's rewards may all tie)
        next(trainer.model.parameters()).add_(1e-2)
    engine.sync_from = lambda model: None  # the hand-off silently does nothing
    with pytest.raises(StaleWeights, match="stale"):
        trainer.train_step(batches)
