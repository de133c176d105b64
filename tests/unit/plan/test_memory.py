"""Parameter counts and the training-memory estimate; preflight refuses what cannot fit."""

from __future__ import annotations

import pytest
import torch

from align.config import Family, to_typed
from align.errors import ConfigError
from align.plan import memory
from align.plan.memory import estimate_memory


def _cfg(compose, *ov):
    """The estimates below were written for sampler=shuffle (micro_batch_size rows at data.max_seq_len),
    all logits at once and torch's partitioner default unless a test names them."""
    pinned = [] if any(o.startswith("sampler=") for o in ov) else ["sampler=shuffle"]
    from align.plan.budget_auto import plan_memory_budget

    if not any(o.startswith("trainer.loss_chunk_tokens=") for o in ov):
        pinned.append("trainer.loss_chunk_tokens=0")
    cfg = to_typed(compose(["allow_dirty=true", *pinned, *ov]))
    return plan_memory_budget(cfg, torch.device("cpu"))[0]  # auto is torch's default off CUDA


def test_active_params_drop_exactly_the_unrouted_expert_share(build):
    b = build(Family.olmoe)
    experts = sum(p.numel() for n, p in b.model.named_parameters() if ".experts." in n)
    E, k = 8, 2
    assert experts > 0
    assert b.info["params_active"] == b.info["params_total"] - experts * (E - k) // E
    dense = build(Family.mistral)
    assert dense.info["params_active"] == dense.info["params_total"]


def test_estimate_counts_match_the_built_model_including_peft_lora_params(build, compose):
    full = estimate_memory(_cfg(compose, "model=olmoe"), torch.device("cpu"))
    assert full.params.total == build(Family.olmoe).info["params_total"]
    from align.config import LoraConfig

    lora = estimate_memory(_cfg(compose, "model=olmoe", "model.lora.enabled=true", "model.lora.r=4"),
                           torch.device("cpu"))
    built = build(Family.olmoe, lora=LoraConfig(enabled=True, r=4))
    assert lora.params.trainable == built.info["params_trainable"]  # arithmetic == what peft created


def test_estimate_components_move_the_right_way(compose):
    cpu = torch.device("cpu")
    base = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full"), cpu)
    assert base.weights == 7_248_023_552 * 4 and base.grads == base.weights and base.optimizer == 2 * base.weights
    bf16 = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "model.dtype=bfloat16"), cpu)
    assert bf16.weights == base.weights // 2
    eight = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "optimizer=adamw8bit"), cpu)
    assert eight.optimizer == 7_248_023_552 * 2
    ckpt = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full",
                                "parallel.activation_checkpointing=true"), cpu)
    assert ckpt.activations < base.activations / 3
    half = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "parallel.activation_checkpointing=true",
                                "parallel.activation_checkpointing_fraction=0.5"), cpu)
    assert ckpt.activations < half.activations < base.activations  # 16 of 32 blocks keep their activations
    small_batch = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "sampler.micro_batch_size=1"),
                                  cpu)
    assert small_batch.activations * 8 == base.activations
    lora = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "model.lora.enabled=true"), cpu)
    assert lora.grads < base.grads / 100 and lora.weights == base.weights


def test_preflight_refuses_a_config_that_cannot_fit_unless_allowed(compose, monkeypatch):
    from align.run.preflight_checks import run_preflight

    monkeypatch.setattr(memory, "device_memory", lambda device: 80 * 1024**3)  # an 80 GiB card
    with pytest.raises(ConfigError,
                       match=r"model.allow_over_memory: the training-memory estimate does not fit.*7.248B"):
        run_preflight(_cfg(compose, "model=mistral", "model.preset=full"))
    checks = run_preflight(_cfg(compose, "model=mistral", "model.preset=full", "model.allow_over_memory=true"))
    assert any(c.name == "params and memory" and "allowed by model.allow_over_memory" in c.detail for c in checks)
    fits = run_preflight(_cfg(compose, "model=olmoe", "model.preset=full", "model.dtype=bfloat16",
                              "model.lora.enabled=true", "parallel.activation_checkpointing=true",
                              "sampler.micro_batch_size=1"))
    line = [c for c in fits if c.name == "params and memory"][0].detail
    assert "6.919B" in line and "1.28" in line and "active" in line


def test_tokens_per_micro_batch_follow_the_batching_that_runs(compose):
    from align.plan.memory import tokens_per_micro_batch

    def tokens(*ov):
        return tokens_per_micro_batch(_cfg(compose, "data.max_seq_len=512", *ov))

    assert tokens("sampler.micro_batch_size=4") == 4 * 512  # shuffle / bucket: the padded worst case
    assert tokens("sampler=budget", "sampler.max_tokens=3000") == 3000  # rows x padded width <= the budget
    assert tokens("objective=dpo", "sampler.micro_batch_size=4") == 2 * 4 * 512  # pairs: both sides
    assert tokens("objective=dpo", "sampler=budget", "sampler.max_tokens=3000") == 3000  # a pair unit holds both
    # grpo: 16 x 16 completions cut into 2 updates x 4 micro-batches -> 32 sequences of at most max_seq_len
    assert tokens("objective=grpo", "objective.updates_per_rollout=2", "trainer.grad_accum=4") == 32 * 512
    # grpo under a token budget: each micro-batch of the cut holds at most max_tokens (a GPU run of the
    # whole 512-completion rollout was refused at 524,288 tokens before this)
    assert tokens("objective=grpo", "sampler=budget", "sampler.max_tokens=4096") == 4096


def test_accumulated_grads_and_a_frozen_reference_copy_add_to_the_peak(compose):
    cpu = torch.device("cpu")
    one = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full"), cpu)
    four = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "trainer.grad_accum=4"), cpu)
    assert one.total == one.weights + one.optimizer + max(one.activations + one.logits, one.grads)
    assert four.total == one.total - max(one.activations + one.logits, one.grads) + one.activations + one.logits \
        + one.grads  # the earlier micro-batches' grads are held through the later forwards
    dpo = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "objective=dpo",
                               "objective.reference=model", "objective.reference_dtype=bf16"), cpu)
    assert dpo.reference == one.params.total * 2
    off = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "objective=dpo",
                               "model.lora.enabled=true"), cpu)
    assert off.reference == 0  # adapters off: the base is the reference, no second copy


def test_a_chunked_loss_holds_one_chunk_of_logits(compose):
    cpu = torch.device("cpu")
    full = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "sampler.micro_batch_size=2"), cpu)
    chunk = estimate_memory(_cfg(compose, "model=mistral", "model.preset=full", "sampler.micro_batch_size=2",
                                 "trainer.loss_chunk_tokens=1024"), cpu)
    assert chunk.logits * full.tokens_per_micro_batch == full.logits * 1024
    assert chunk.activations == full.activations
