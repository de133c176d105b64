"""trainer.loss_chunk_tokens=auto (align/plan/chunk_auto.py): what it resolves to per device and
model, and that an unresolved auto never reaches a loss or an estimate."""

from __future__ import annotations

import pytest
import torch

from align.config import to_typed
from align.errors import ConfigError
from align.plan.chunk_auto import CHUNK, RATIO, per_token_bytes, plan_loss_chunk

CUDA = torch.device("cuda")
GEMMA4_26B_LORA = ["model=gemma4_moe", "model.preset=full", "model.dtype=bfloat16", "model.lora.enabled=true"]


def _cfg(compose, *ov):
    return to_typed(compose(["allow_dirty=true", *ov]))


def test_on_a_cpu_auto_keeps_all_logits_at_once(compose):
    cfg = _cfg(compose, *GEMMA4_26B_LORA)  # a model that chunks on CUDA
    resolved, record = plan_loss_chunk(cfg, torch.device("cpu"))
    assert cfg.trainer.loss_chunk_tokens == "auto" and resolved.trainer.loss_chunk_tokens == 0
    assert record["requested"] == "auto" and record["resolved"] == 0 and "on cpu" in record["why"]


@pytest.mark.parametrize("overrides,chunk", [
    (GEMMA4_26B_LORA, CHUNK),  # 262,144 logits per token against a 2,816-wide residual stream
    ([*GEMMA4_26B_LORA, "parallel.activation_checkpointing=true"], CHUNK),  # fewer kept activations: more so
    (["experiment=bench/moe_default"], 0),
    (["experiment=bench/dense_default"], 0),
    (["experiment=bench/dense_default", "model.overrides.vocab_size=262144"], CHUNK),  # the vocabulary decides
])
def test_on_cuda_it_chunks_where_the_logits_would_weigh_as_much_as_the_kept_activations(compose, overrides, chunk):
    cfg = _cfg(compose, *overrides)
    logits, acts = per_token_bytes(cfg, CUDA)
    resolved, record = plan_loss_chunk(cfg, CUDA)
    assert (logits / acts >= RATIO) == (chunk > 0), (logits, acts)
    assert resolved.trainer.loss_chunk_tokens == record["resolved"] == chunk
    assert f"{logits / acts:.2f} x" in record["why"]


def test_a_given_chunk_is_kept(compose):
    for given in (0, 512):
        cfg, record = plan_loss_chunk(_cfg(compose, *GEMMA4_26B_LORA, f"trainer.loss_chunk_tokens={given}"), CUDA)
        assert cfg.trainer.loss_chunk_tokens == given
        assert record == {"requested": given, "resolved": given, "why": "trainer.loss_chunk_tokens as given"}


@pytest.mark.parametrize("bad", ["lots", "-1", "true", "1.5"])
def test_a_chunk_that_is_no_int_and_not_auto_is_refused(compose, bad):
    with pytest.raises(ConfigError) as e:
        _cfg(compose, f"trainer.loss_chunk_tokens={bad}")
    assert e.value.key == "trainer.loss_chunk_tokens" and "auto" in e.value.message


def test_an_unresolved_auto_reaches_no_objective_or_estimate(compose):
    from align.objectives import build_objective
    from align.plan.memory import estimate_memory

    cfg = _cfg(compose, "sampler.max_tokens=4096")
    with pytest.raises(ValueError, match="loss_chunk_tokens='auto' reached the objective unresolved"):
        build_objective(cfg)
    with pytest.raises(ValueError, match="loss_chunk_tokens='auto' reached the memory estimate unresolved"):
        estimate_memory(cfg, CUDA)
