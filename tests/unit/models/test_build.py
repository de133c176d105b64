"""Building and loading: resolved backends are read back from the model, experts kernels agree,
local fp32 checkpoints load cast to the requested dtype."""

from __future__ import annotations

import json

import pytest
import torch

from align.config import AttentionConfig, ExpertsImpl, Family, ModelConfig, MoEConfig
from align.errors import ConfigError
from align.models.build import describe_model
from align.models.family_table import FAMILIES
from tests.unit.models.conftest import MOE_FAMILIES, batch, perturb_


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny_preset_builds_trains_one_step_and_reports_what_it_resolved(build, family, tokenizer):
    b = build(family)
    i = b.info
    assert i["family"] == family.value and i["preset"] == "tiny" and i["dtype"] == "float32"
    # attention=auto: each layer type its own kernel for Gemma-4's mixed layers, sdpa for the rest
    want = "align_layered" if family in (Family.gemma4, Family.gemma4_moe) else "sdpa"
    assert i["attn_implementation_resolved"] == b.model.config._attn_implementation == want
    assert (i["attention_layers"] is not None) == (want == "align_layered")
    assert i["params_total"] == sum(p.numel() for p in b.model.parameters())
    moe = family in MOE_FAMILIES
    assert (i["moe"] is not None) == moe and (i["experts_implementation_resolved"] is not None) == moe
    ids, mask = batch(len(tokenizer), pad_last=4)
    out = b.model(input_ids=ids, attention_mask=mask, use_cache=False)
    out.logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in b.model.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_experts_backend_requested_and_resolved_are_recorded_and_read_back(build, family):
    default = build(family)
    assert default.info["experts_implementation_requested"] is None
    assert default.info["experts_implementation_resolved"] == "grouped_mm"  # transformers' default (docs/pitfalls.md#3)
    for impl in ExpertsImpl:
        b = build(family, moe=MoEConfig(experts=impl))
        assert b.info["experts_implementation_requested"] == impl.value
        assert b.info["experts_implementation_resolved"] == impl.value == b.model.config._experts_implementation
    # read back from the object, not echoed from the request:
    b.model.config._experts_implementation = "eager"
    from align.models.attention import resolve_attention
    from align.models.family_table import FAMILIES

    cfg = ModelConfig(family=family, moe=MoEConfig(experts=ExpertsImpl.batched_mm))
    info = describe_model(b.model, cfg, resolve_attention(family, AttentionConfig(), "cpu"),
                          FAMILIES[family].moe_shape(b.model.config), None)
    assert info["experts_implementation_requested"] == "batched_mm"
    assert info["experts_implementation_resolved"] == "eager"


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_the_three_experts_kernels_compute_the_same_function_in_fp32(build, family, tokenizer):
    ids, mask = batch(len(tokenizer), pad_last=3)
    logits = {}
    for impl in ExpertsImpl:
        m = perturb_(build(family, moe=MoEConfig(experts=impl), seed=3).model).eval()
        with torch.no_grad():
            logits[impl] = m(input_ids=ids, attention_mask=mask, use_cache=False).logits
    ref = logits[ExpertsImpl.eager]
    for impl in (ExpertsImpl.batched_mm, ExpertsImpl.grouped_mm):
        assert (logits[impl] - ref).abs().max() < 1e-5, impl


def test_router_losses_on_a_dense_family_are_refused(build):
    for fam in (Family.mistral, Family.gemma4):
        with pytest.raises(ConfigError, match="model.moe.lb_weight.*dense"):
            build(fam, moe=MoEConfig(lb_weight=0.01))


@pytest.mark.parametrize("family", [Family.mistral, Family.olmoe])
def test_fp32_checkpoint_in_shards_loads_locally_cast_to_bf16(build, family, tokenizer, tmp_path):
    src = perturb_(build(family).model)
    src.save_pretrained(tmp_path, max_shard_size="300KB")  # several shards, as a real 7B checkpoint has
    tokenizer.save_pretrained(tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float32"
    b = build(family, pretrained=str(tmp_path), dtype="bfloat16")
    assert b.info["dtype"] == "bfloat16" and b.info["checkpoint_dtype"] == "float32" and b.info["preset"] is None
    got = dict(b.model.named_parameters())
    for name, p in src.named_parameters():
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], p.detach().to(torch.bfloat16)), name
