"""`model=hf`: any local causal-LM checkpoint. A model_type of align's families runs exactly as that
family; any other through its own transformers class, with what align reads from a model (LoRA
targets, the memory estimate, routers) found generically. Tiny checkpoints are built from configs."""

from __future__ import annotations

import pytest

from align.config import Family, LoraConfig, ModelConfig, MoEConfig, to_typed
from align.errors import ConfigError
from align.models.family import family_spec
from align.models.family_table import FAMILIES
from tests.conftest import tiny_checkpoint, tiny_hf_checkpoint


def test_model_hf_without_a_checkpoint_is_refused_naming_model_pretrained(compose):
    with pytest.raises(ConfigError, match=r"^model.pretrained: model=hf needs a checkpoint dir"):
        to_typed(compose(["model=hf"]))


@pytest.mark.parametrize("family", [Family.mistral, Family.gemma4_moe])
def test_an_align_familys_checkpoint_under_model_hf_is_that_familys_run(build, compose, tmp_path, family):
    """Preflight's checklist, the compile rule and the built model (attention, routers) are those of
    `model=<family>` with the same checkpoint; only the requested family differs."""
    from align.plan.compile_auto import resolve_trainer_compile
    from align.run.manifest import load
    from align.run.preflight_checks import collect
    from align.run.record import RunRecord

    d = tiny_checkpoint(tmp_path / "ckpt", family)
    typed = {f: to_typed(compose([f"model={f}", f"model.pretrained={d}", "allow_dirty=true"]))
             for f in (family.value, "hf")}
    checks = {f: {c.name: c.detail for c in collect(t)} for f, t in typed.items()}
    spec = FAMILIES[family]
    assert family_spec(typed["hf"].model) is spec
    assert checks["hf"].pop("checkpoint family") == (f"model_type {spec.model_type!r}: model=hf runs as "
                                                     f"model={family.value} ({spec.architecture})")
    checks[family.value].pop("checkpoint family")
    for c in checks.values():  # the host's free memory, read at each collect, moves under other processes
        c["params and memory"] = c["params and memory"].rsplit(" vs cpu ", 1)[0]
    assert checks["hf"] == checks[family.value]
    assert resolve_trainer_compile(typed["hf"], "cuda") == resolve_trainer_compile(typed[family.value], "cuda")
    for f, t in typed.items():  # the manifest, from its start, names the family built
        RunRecord(t, {}, tmp_path / f, [], []).start([])
        assert load(tmp_path / f)["model"]["family"] == family.value

    built = {f: build(t.model, t.attention) for f, t in typed.items()}
    assert built["hf"].info.pop("family_requested") == "hf"
    assert built[family.value].info.pop("family_requested") == family.value
    assert built["hf"].info == built[family.value].info and built["hf"].info["family"] == family.value
    assert (built["hf"].runtime.moe is not None) == (family == Family.gemma4_moe)


@pytest.mark.parametrize("kind,targets", [
    ("llama", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("qwen2", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("phi3", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),  # fused projections
])
def test_lora_targets_every_attention_and_mlp_linear_of_a_generic_class(build, tmp_path, kind, targets):
    cfg = ModelConfig(family=Family.hf, pretrained=str(tiny_hf_checkpoint(kind, tmp_path / kind)),
                      lora=LoraConfig(enabled=True, r=4))
    b = build(cfg)
    info = b.info["lora"]
    assert {t.rsplit(".", 1)[-1] for t in info["targets"]} == targets
    assert info["target_modules"] == 2 * len(targets) and info["not_adapted_linears"] == ["lm_head"]
    assert b.info["family"] == "hf" and b.info["model_type"] == kind


def test_the_kv_cache_estimate_reads_a_fused_qkv_layer_from_the_config(tmp_path):
    """Phi-3 has no k_proj (one fused qkv_proj): its KV width comes from the config, as Llama's of the
    same shape is read off its k_proj."""
    from align.plan.memory import kv_elements_per_token, meta_model

    per = {k: kv_elements_per_token(meta_model(ModelConfig(family=Family.hf, pretrained=str(
        tiny_hf_checkpoint(k, tmp_path / k))))[0]) for k in ("llama", "phi3")}
    assert per["phi3"] == per["llama"] == 2 * 2 * (2 * 64 // 4)  # layers x (k, v) x kv_heads x head_dim


def test_a_generic_moe_counts_its_experts_but_reads_no_router(build, tmp_path):
    """A model_type of no align family with experts (Qwen3-MoE): parameter counts know the experts, but
    align has no router taps for it: no telemetry, and router losses are refused, not dropped."""
    d = tiny_hf_checkpoint("qwen3_moe", tmp_path / "moe", num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32)
    cfg = ModelConfig(family=Family.hf, pretrained=str(d))
    spec = family_spec(cfg)
    assert spec.name == Family.hf and spec.is_moe and not spec.reads_routers
    b = build(cfg)
    assert b.info["moe"]["num_experts"] == 4 and b.info["moe"]["telemetry"] is False and b.runtime.moe is None
    assert b.info["params_active"] < b.info["params_total"]
    with pytest.raises(ConfigError, match=r"model.moe.lb_weight: model=hf \(Qwen3MoeForCausalLM\) has routers align "
                                          r"does not read"):
        build(Family.hf, pretrained=str(d), moe=MoEConfig(lb_weight=0.01))


def test_preflight_passes_a_generic_checkpoint_and_names_the_class_it_builds(compose, tmp_path):
    from align.run.preflight_checks import collect

    d = tiny_hf_checkpoint("phi3", tmp_path / "phi3")
    typed = to_typed(compose(["model=hf", f"model.pretrained={d}", "allow_dirty=true", "model.lora.enabled=true"]))
    checks = {c.name: c for c in collect(typed)}
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert checks["checkpoint family"].detail == (
        "model_type 'phi3': model=hf builds Phi3ForCausalLM (AutoModelForCausalLM's class)")
    assert checks["attention resolution (align.models)"].detail == "sdpa"
    assert "Phi3Config" in checks["model from_pretrained/_from_config"].detail
