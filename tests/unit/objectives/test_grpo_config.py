"""objective=grpo's keys: composed from conf/objective/grpo.yaml (its schema, GRPOConfig: another objective's
key is refused as unknown, tests/config/test_objective_schemas.py), values checked with one line naming the key."""

from __future__ import annotations

import pytest

from align.config import to_typed
from align.errors import ConfigError


def test_the_embedded_default_composes_to_the_add_task_with_an_exact_match_reward(compose):
    cfg = to_typed(compose(["objective=grpo"]))
    assert cfg.objective.kind == "grpo" and cfg.data.source.value == "add"
    assert cfg.reward.weights == {"exact_int": 1.0}
    assert cfg.model.preset.value == "tiny" and cfg.model.pretrained is None


def test_the_issue_command_lines_compose(compose):
    cfg = to_typed(compose(["objective=grpo", "data=gsm8k_prompts", "reward=gsm8k"]))
    assert (cfg.data.source.value, cfg.data.response_field, cfg.reward.weights) == ("gsm8k", "answer", {"gsm8k": 1.0})
    cfg = to_typed(compose(["objective=grpo", "objective.advantage=dr_grpo", "objective.loss_agg=seq_mean_token_sum"]))
    assert (cfg.objective.advantage.value, cfg.objective.loss_agg.value) == ("dr_grpo", "seq_mean_token_sum")
    for g in (4, 8, 16):
        assert to_typed(compose(["objective=grpo", f"objective.group_size={g}"])).objective.group_size == g


BAD = [
    (["objective.group_size=1"], "objective.group_size", "needs >= 2"),
    # every composition whose advantages are all 0 by construction (align/objectives/advantages.py)
    (["objective.group_size=1", "objective.advantage=dr_grpo"], "objective.group_size",
     "advantage=dr_grpo needs >= 2 completions per prompt"),
    (["objective.group_size=1", "objective.advantage=rloo"], "objective.group_size", "advantage=rloo needs >= 2"),
    (["reward.weights.exact_int=0"], "reward.weights", "every completion scores 0 whatever it says"),
    (["reward=gsm8k", "+reward.weights.format=0", "reward.weights.gsm8k=0.0", "objective.advantage=rloo"],
     "reward.weights", "under advantage=rloo would be 0"),
    (["objective.temperature=0"], "objective.temperature", "> 0"),
    (["objective.top_p=0"], "objective.top_p", "(0, 1]"),
    (["objective.clip_low=1.0"], "objective.clip_low", "[0, 1)"),
    (["objective.is_cap=0.5"], "objective.is_cap", ">= 1"),
    (["objective.kl_coef=-1"], "objective.kl_coef", ">= 0"),
    (["objective.reference=precomputed", "objective.kl_coef=0.1"], "objective.reference", "precomputed"),
    (["objective.reference=model"], "objective.reference", "kl_coef=0 reads no reference"),
    (["objective.kl_coef=0.1", "objective.reference=none"], "objective.reference", "needs a reference"),
    (["reward=none"], "reward.weights", "needs a reward"),
    (["data.truncation=truncate"], "data.truncation", "refuses to cut prompts"),
    (["sampler=bucket"], "sampler.kind", "sampler=shuffle (trainer.grad_accum micro-batches) or sampler=budget"),
    (["sampler=budget", "sampler.max_tokens=63"], "sampler.max_tokens", "data.max_seq_len (64 tokens"),
    (["sampler=budget", "sampler.max_tokens=64", "sampler.pad_to_multiple_of=48"], "sampler.max_tokens",
     "(96 tokens after padding"),
    (["sampler=budget", "trainer.grad_accum=2"], "trainer.grad_accum", "ignored by objective=grpo with sampler=budget"),
    (["sampler=budget", "sampler.bucket_size=8"], "sampler.bucket_size", "sorted by length as one bucket"),
    (["sampler.micro_batch_size=4"], "sampler.micro_batch_size", "ignored by objective=grpo"),
    (["objective.prompts_per_rollout=1", "objective.group_size=2", "trainer.grad_accum=4"],
     "objective.prompts_per_rollout", "must fill"),
    (["data.max_seq_len=8", "objective.max_new_tokens=8"], "data.max_seq_len", "must exceed"),
]


def test_sampler_budget_composes_under_grpo_and_needs_no_grad_accum(compose):
    cfg = to_typed(compose(["objective=grpo", "sampler=budget", "sampler.max_tokens=64", "sampler.packed=true",
                            "objective.prompts_per_rollout=1", "objective.group_size=2",
                            "objective.updates_per_rollout=2"]))
    assert cfg.sampler.kind.value == "budget" and cfg.trainer.grad_accum == 1


@pytest.mark.parametrize("overrides,key,what", BAD, ids=[b[1] + ":" + b[0][0] for b in BAD])
def test_bad_values_are_one_line_naming_the_key(compose, overrides, key, what):
    with pytest.raises(ConfigError) as e:
        to_typed(compose(["objective=grpo", *overrides]))
    assert str(e.value).startswith(f"{key}: ") and what in str(e.value) and "\n" not in str(e.value)


def test_a_reward_of_verifiers_that_give_one_value_is_refused(compose, monkeypatch):
    """A reward constant by construction whatever its weight: a verifier that can give one value only."""
    from align.rewards import get_verifier

    to_typed(compose(["objective=grpo"]))  # exact_int gives 0 or 1: accepted
    monkeypatch.setattr(type(get_verifier("exact_int")), "VALUES", (1.0,))
    with pytest.raises(ConfigError, match=r"^reward.weights: every completion scores 1 whatever it says"):
        to_typed(compose(["objective=grpo"]))


def test_a_reward_under_sft_is_refused(compose):
    with pytest.raises(ConfigError, match="^reward.weights: is read by objective=grpo only"):
        to_typed(compose(["reward=gsm8k"]))
