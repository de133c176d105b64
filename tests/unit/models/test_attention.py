"""Attention per family: unsupported backends are refused before anything heavy, or fall back loudly
and are recorded when allowed."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from align.config import AttentionConfig, AttnImpl, Fallback, Family
from align.errors import ConfigError
from align.models.attention import resolve_attention
from align.models.family_table import FAMILIES


def test_olmoe_flex_is_refused_with_the_reason():
    with pytest.raises(ConfigError) as e:
        resolve_attention(Family.olmoe, AttentionConfig(AttnImpl.flex), "cpu")
    msg = str(e.value)
    assert msg.startswith("attention.implementation:") and "does not support flex_attention" in msg
    assert "attention.fallback=allow" in msg


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed here")
def test_flash_without_flash_attn_is_refused_for_every_family():
    for fam in FAMILIES:
        with pytest.raises(ConfigError, match="flash-attn package"):
            resolve_attention(fam, AttentionConfig(AttnImpl.flash), "cuda")


def test_supported_backends_resolve_to_themselves():
    for fam in FAMILIES:
        for impl in (AttnImpl.sdpa, AttnImpl.eager):
            c = resolve_attention(fam, AttentionConfig(impl), "cpu")
            assert (c.requested, c.resolved, c.reason) == (impl, impl, None)
    assert resolve_attention(Family.gemma4, AttentionConfig(AttnImpl.flex), "cpu").resolved == AttnImpl.flex


def test_fallback_allow_logs_loudly_and_the_built_model_records_requested_resolved_and_why(build, caplog):
    with caplog.at_level(logging.WARNING, logger="align"):
        b = build(Family.olmoe, attention=AttentionConfig(AttnImpl.flex, Fallback.allow))
    assert any("ATTENTION FALLBACK" in r.getMessage() for r in caplog.records)
    i = b.info
    assert i["attn_implementation_requested"] == "flex_attention"
    assert i["attn_implementation_resolved"] == "sdpa" == b.model.config._attn_implementation
    assert "does not support flex_attention" in i["attn_fallback_reason"]


def test_preflight_lists_the_attention_check_and_refuses_before_any_model_load(compose, monkeypatch):
    import align.models.build as build_mod
    from align.config import to_typed
    from align.run.preflight_checks import run_preflight

    monkeypatch.setattr(build_mod, "build_model", lambda *a, **k: pytest.fail("preflight must not build the model"))
    with pytest.raises(ConfigError, match="attention.implementation"):
        run_preflight(to_typed(compose(["model=olmoe", "attention=flex", "allow_dirty=true"])))
    checks = run_preflight(to_typed(compose(["model=olmoe", "attention=flex", "attention.fallback=allow",
                                             "allow_dirty=true"])))
    att = [c for c in checks if c.name == "attention resolution (align.models)"]
    assert att and att[0].status.value == "WARN"
    assert "runs sdpa: olmoe's transformers class does not support" in att[0].detail

    from align.run.model_checks import model_checks

    refused = [c for c in model_checks(to_typed(compose(["model=olmoe", "attention=flex"]))) if not c.ok]
    assert refused[0].key == "attention.implementation" and "does not support flex_attention" in refused[0].detail


def test_sdpa_kernels_restrict_the_kernel_torch_may_pick_in_every_training_forward(tmp_path):
    """attention.sdpa_kernels is applied around the trainer's forward: on CPU only flash (CPU) and
    math exist, so allowing only the CUDA-only efficient kernel must leave SDPA without a kernel;
    allowing math must train. A setting that silently did nothing would pass the first case."""
    from tests.conftest import build_trainer

    t = build_trainer(tmp_path / "a", "trainer.max_steps=1", "attention.sdpa_kernels=[efficient]")
    b = next(iter(t.stream))
    with pytest.raises(RuntimeError, match="[Nn]o (available kernel|viable backend)"):
        t.forward_backward(b.to(t.env.device), 1.0)
    t = build_trainer(tmp_path / "b", "trainer.max_steps=1", "attention.sdpa_kernels=[math,flash]")
    b = next(iter(t.stream))
    assert torch.isfinite(t.forward_backward(b.to(t.env.device), 1.0))


def test_sdpa_kernels_hold_for_the_activation_checkpoint_recompute_in_backward(tmp_path, monkeypatch):
    """Non-reentrant checkpointing recomputes attention inside `.backward()`: outside the priority
    context torch picks its default kernel there (cuDNN on the H200, whose saved tensors differ from
    flash's: the checkpoint fails). Every SDPA call, forward and recompute, must see the restriction."""
    from tests.conftest import build_trainer

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.is_grad_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    t = build_trainer(tmp_path, "trainer.max_steps=1", "attention.sdpa_kernels=[math,flash]",
                      "parallel.activation_checkpointing=true")
    b = next(iter(t.stream))
    assert torch.isfinite(t.forward_backward(b.to(t.env.device), 1.0))
    layers = t.model.config.num_hidden_layers
    assert len(seen) == 2 * layers, seen  # each layer's forward, then its recompute in backward
    assert not any(enabled for _, enabled in seen), seen  # `efficient` is outside the list: off every time
