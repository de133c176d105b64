"""The round-trip gate passes for every family's tiny preset and a LoRA-merged export, and fails when
a classic porting bug is injected into the exported weights or config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from align.config import Family, LoraConfig
from align.models.family_table import FAMILIES
from align.models.roundtrip import compare, load_export, outputs, verify_export
from tests.conftest import build_tiny
from tests.unit.models.conftest import MOE_FAMILIES, perturb_


def _ids(tokenizer=None, n=24):
    return torch.randint(3, 4096, (2, n), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer):
    """One clean export per family, with its reference outputs (built once for the module)."""
    out = {}
    for fam in FAMILIES:
        model = perturb_(build_tiny(fam).model)
        d = tmp_path_factory.mktemp(fam.value) / "export"
        report = verify_export(model, tokenizer, d, fam, _ids(tokenizer))
        out[fam] = (d, report, outputs(model, fam, _ids(tokenizer)), model)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_clean_export_of_every_tiny_preset_passes(exported, family):
    _, report, ref, _ = exported[family]
    assert report.passed, report.line()
    assert report.max_abs_diff < 1e-5 and report.top1_agreement == 1.0
    if family in MOE_FAMILIES:
        assert sorted(report.router_agreement) == sorted(ref.topk) and len(ref.topk) > 0
        assert all(v == 1.0 for v in report.router_agreement.values())


@pytest.mark.parametrize("family", [Family.olmoe])
def test_lora_merged_export_passes(build, family, tokenizer, tmp_path):
    b = build(family, lora=LoraConfig(enabled=True, r=4, alpha=8.0))
    with torch.no_grad():  # a trained adapter: B away from its zero init, so the merge matters
        for n, p in b.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    plain = outputs(b.model.get_base_model(), family, _ids(tokenizer))  # captured before the merge
    with b.model.disable_adapter():
        unadapted = outputs(b.model, family, _ids(tokenizer))
    report = verify_export(b.model, tokenizer, tmp_path / "export", family, _ids(tokenizer))
    assert report.passed, report.line()
    assert (plain.logits - unadapted.logits).abs().max() > 1e-3  # the adapter changed the function
    assert not any("lora" in k for k in load_file(str(tmp_path / "export" / "model.safetensors")))


def _mutate(src: Path, dst: Path, edit_weights=None, edit_config=None) -> Path:
    import shutil

    shutil.copytree(src, dst)
    if edit_weights:
        f = dst / "model.safetensors"
        w = load_file(str(f))
        edit_weights(w)
        save_file(w, str(f), metadata={"format": "pt"})
    if edit_config:
        c = json.loads((dst / "config.json").read_text())
        edit_config(c)
        (dst / "config.json").write_text(json.dumps(c))
    return dst


def _swap(w, a, b):
    w[a], w[b] = w[b].clone(), w[a].clone()


def _swap_experts(w):
    fused = [k for k in w
             if k.startswith("model.layers.0.") and k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    if fused:  # Gemma-4 saves fused [E, ...] tensors
        for k in fused:
            w[k] = w[k][[1, 0, *range(2, w[k].shape[0])]].contiguous()
        return
    for part in ("gate_proj", "up_proj", "down_proj"):  # OLMoE saves the hub's per-expert layout
        _swap(w, f"model.layers.0.mlp.experts.0.{part}.weight", f"model.layers.0.mlp.experts.1.{part}.weight")


def _rope_base(c):
    rp = c["rope_parameters"]
    for params in rp.values() if all(isinstance(v, dict) for v in rp.values()) else [rp]:
        params["rope_theta"] = 1_000_000.0 if params["rope_theta"] != 1_000_000.0 else 10_000.0


def _norms(w):
    _swap(w, "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight")


BUGS = [(f, "expert order swapped", _swap_experts, None) for f in MOE_FAMILIES] + \
       [(f, "wrong RoPE base", None, _rope_base) for f in FAMILIES] + \
       [(f, "wrong norm placement", _norms, None) for f in FAMILIES]


@pytest.mark.parametrize("family,bug,weights,config", BUGS, ids=[f"{b[0].value}-{b[1]}" for b in BUGS])
def test_an_injected_porting_bug_fails_the_gate(exported, family, bug, weights, config, tmp_path):
    d, _, ref, model = exported[family]
    broken = _mutate(d, tmp_path / "broken", weights, config)
    report = compare(ref, outputs(load_export(broken, family, like=model), family, _ids(None)))
    assert not report.passed, f"{bug} went unnoticed: {report.line()}"
    assert report.max_abs_diff > 1e-3  # fails by orders of magnitude, not by a hair


def test_compare_fails_on_nan_and_on_a_router_flip_alone():
    logits = torch.zeros(1, 3, 5)
    ok = compare(type("O", (), {"logits": logits, "topk": {0: torch.tensor([[0, 1]])}})(),
                 type("O", (), {"logits": logits.clone(), "topk": {0: torch.tensor([[1, 0]])}})())
    assert ok.passed  # the same SET in another order is agreement
    flip = compare(type("O", (), {"logits": logits, "topk": {0: torch.tensor([[0, 1]])}})(),
                   type("O", (), {"logits": logits.clone(), "topk": {0: torch.tensor([[0, 2]])}})())
    assert not flip.passed and "router top-k set agreement" in flip.failures[0]
    nan = compare(type("O", (), {"logits": logits, "topk": {}})(),
                  type("O", (), {"logits": logits.clone().fill_(float("nan")), "topk": {}})())
    assert not nan.passed


def test_a_drift_too_small_to_flip_any_token_still_fails_on_the_logit_bound(exported, tmp_path):
    d, _, ref, model = exported[Family.mistral]

    def nudge(w):
        w["model.norm.weight"] = w["model.norm.weight"] * (1 + 1e-4)

    got = outputs(load_export(_mutate(d, tmp_path / "nudged", nudge), Family.mistral, like=model), Family.mistral,
                  _ids())
    report = compare(ref, got)
    assert report.top1_agreement == 1.0 and not report.passed and report.failures[0].startswith("max |dlogit|")
