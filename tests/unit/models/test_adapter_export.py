"""LoRA as users ship it: peft's adapter files in export/adapter/ that `PeftModel.from_pretrained(base, ...)`
loads onto the model the run started from with the trained model's logits, beside a merged export that
still has them; the export choice; target modules chosen by name; the gathered-state path a sharded
model takes (adapter picked out of the full state dict, merge in a host copy)."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from align.config import Family, LoraConfig, LoraExport
from align.errors import ConfigError
from align.models.export import export_hf
from align.models.lora import LoraGate
from align.models.roundtrip import compare, load_export, outputs
from tests.unit.models.conftest import perturb_

IDS = torch.randint(3, 4096, (3, 20), generator=torch.Generator().manual_seed(5))


def _lora(**kw):
    return LoraConfig(enabled=True, r=4, alpha=8.0, **kw)


def _trained_(model):
    """Adapters as training leaves them: lora_B away from its zero init, so the adapter matters."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@pytest.fixture
def base_dir(build, tokenizer, tmp_path):
    """A local checkpoint to start from (model.pretrained), one per family."""
    def _save(family: Family):
        d = tmp_path / f"base_{family.value}"
        perturb_(build(family).model).save_pretrained(d)
        tokenizer.save_pretrained(d)
        return d
    return _save


@pytest.mark.parametrize("family", [Family.mistral, Family.olmoe])
def test_the_adapter_on_its_base_and_the_merged_export_both_equal_the_trained_model(base_dir, build, tokenizer,
                                                                                   tmp_path, family, compose):
    from align.config import to_typed
    from align.models.adapter import base_model

    base = base_dir(family)
    cfg = to_typed(compose([f"model={family.value}", f"model.pretrained={base}", "model.lora.enabled=true",
                            "model.lora.r=4", "model.lora.alpha=8"]))
    b = build(cfg.model, cfg.attention)
    ref = outputs(_trained_(b.model), family, IDS)
    names = {m.rpartition(".")[0] for m, _ in b.model.named_modules() if m.endswith(".lora_A")}
    out = export_hf(b.model, tokenizer, tmp_path / "export")

    written = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (written["peft_type"], written["r"], written["lora_alpha"], written["lora_dropout"]) == ("LORA", 4, 8.0, 0.0)
    assert written["base_model_name_or_path"] == str(base)
    assert sorted(written["target_modules"]) == sorted(n.removeprefix("base_model.model.") for n in names)
    assert len(names) == b.info["lora"]["target_modules"]
    plain = base_model(cfg, tokenizer)  # model.pretrained, as transformers loads it
    unadapted = outputs(plain, family, IDS)
    adapted = outputs(PeftModel.from_pretrained(plain, out / "adapter"), family, IDS)
    rep = compare(ref, adapted)
    assert rep.passed, rep.line()
    assert (ref.logits - unadapted.logits).abs().max() > 1e-3  # the adapter carries the training
    rep = compare(ref, outputs(load_export(out, family), family, IDS))
    assert rep.passed, rep.line()
    assert (out / "adapter" / "tokenizer_config.json").is_file()


@pytest.mark.parametrize("what,merged_files,adapter_files", [
    (LoraExport.both, True, True), (LoraExport.merged, True, False), (LoraExport.adapter, False, True)])
def test_the_export_choice_writes_what_it_names_and_the_manifest_says_where(build, tokenizer, tmp_path, what,
                                                                          merged_files, adapter_files):
    b = build(Family.mistral, lora=_lora(export=what))
    out = export_hf(_trained_(b.model), tokenizer, tmp_path / "export", what=what)
    assert (out / "model.safetensors").is_file() == (out / "config.json").is_file() == merged_files
    assert (out / "adapter" / "adapter_model.safetensors").is_file() == adapter_files
    assert not (tmp_path / "export.tmp").exists()
    rec = b.info["lora"]["export"]
    assert rec["choice"] == what.value
    assert rec["merged_dir"] == ("export" if merged_files else None)
    assert rec["adapter_dir"] == ("export/adapter" if adapter_files else None)
    assert (rec["adapter_base"] is not None) == adapter_files
    if adapter_files:
        assert rec["adapter_base"].startswith("random init of preset tiny")


def test_target_modules_pick_the_adapted_linears_and_an_unknown_name_is_refused_naming_the_candidates(build,
                                                                                                    tokenizer):
    b = build(Family.mistral, lora=_lora(target_modules=["q_proj", "self_attn.v_proj"]))
    info = b.info["lora"]
    assert info["targets"] == ["model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.v_proj"]
    assert info["target_modules_requested"] == ["q_proj", "self_attn.v_proj"]
    assert "model.layers.*.mlp.up_proj" in info["not_adapted_linears"]
    trainable = {n for n, p in b.model.named_parameters() if p.requires_grad}
    assert trainable and all(".q_proj.lora_" in n or ".v_proj.lora_" in n for n in trainable)
    accepted = "accepted: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
    for bad in (["qproj"], ["q_proj", "lm_head"]):  # a typo; a linear that is never offered
        with pytest.raises(ConfigError, match=rf"^model.lora.target_modules: no attention or dense-MLP nn.Linear "
                                              rf"of MistralForCausalLM is named \['{bad[-1]}'\]; {accepted}$"):
            build(Family.mistral, lora=_lora(target_modules=bad))
    with pytest.raises(ConfigError, match="model.lora.target_modules: must be a non-empty list"):
        _lora(target_modules=[])


def test_preflight_refuses_an_unknown_target_module_before_any_weight_is_built(compose):
    from align.config import to_typed
    from align.run.preflight_checks import collect, run_preflight

    cfg = to_typed(compose(["model=olmoe", "model.lora.enabled=true", "model.lora.target_modules=[q_proj,gate_proj]",
                            "allow_dirty=true", "logger=none"]))
    with pytest.raises(ConfigError, match=r"^model.lora.target_modules: no attention or dense-MLP nn.Linear of "
                                          r"OlmoeForCausalLM is named \['gate_proj'\]; accepted: k_proj, o_proj, "
                                          r"q_proj, v_proj$"):
        run_preflight(cfg)
    failed = [c for c in collect(cfg).checks if c.status.name == "failed"]
    assert {c.key for c in failed} == {"model.lora.target_modules"}  # kwargs site and the model check, one key
    ok = to_typed(compose(["model=olmoe", "model.lora.enabled=true", "model.lora.target_modules=[q_proj]",
                           "allow_dirty=true", "logger=none"]))
    checks = {c.name: c for c in collect(ok).checks}
    assert checks["lora targets"].detail.startswith("2 modules ['model.layers.*.self_attn.q_proj']")
    assert checks["peft adapter export"].status.name == "passed"


def test_a_gathered_state_dict_is_what_the_adapter_and_the_merge_read(build, tokenizer, tmp_path):
    """The path of a sharded model (align/parallel/sharded_export.py): its parameters are not the tensors to
    write; the full state dict its ranks gathered is."""
    b = build(Family.mistral, lora=_lora())
    model = _trained_(b.model)
    ref = outputs(model, Family.mistral, IDS)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # the in-memory adapters no longer hold the trained values; the gathered state does
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.zero_()
    out = export_hf(model, tokenizer, tmp_path / "export", state_dict=full)
    rep = compare(ref, outputs(load_export(out, Family.mistral), Family.mistral, IDS))
    assert rep.passed, rep.line()
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    lora = {k: v for k, v in full.items() if "lora_" in k}
    assert len(saved) == len(lora) and lora
    for k, v in lora.items():
        assert torch.equal(saved[k.replace(".default.", ".")], v), k


def test_the_inert_adapter_gate_reads_the_parameters_the_optimizer_steps(build, tokenizer):
    """fully_shard registers new parameters in place of the built ones (align/parallel/fsdp.py): the
    gate must look at those, not at the zeros it saw at build."""
    b = build(Family.mistral, lora=_lora(gate_steps=1))
    for mod in b.model.modules():  # what sharding does to every parameter, adapters included
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
    opt = torch.optim.AdamW([p for p in b.model.parameters() if p.requires_grad], lr=1e-2)
    b.model(input_ids=IDS, use_cache=False).logits.float().logsumexp(-1).mean().backward()
    opt.step()
    gate = b.runtime.lora_gate
    assert isinstance(gate, LoraGate)
    gate.check(1)
    assert gate.passed is True
