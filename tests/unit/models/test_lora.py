"""LoRA: targets discovered from the model, fused experts reported as skipped, peft kwargs checked
by name, the inert-adapter gate, QLoRA on dense families only, merged export."""

from __future__ import annotations

import pytest
import torch

from align.config import Family, LoraConfig
from align.errors import ConfigError
from align.models.lora import InertAdapterError
from tests.unit.models.conftest import batch


def _lora(**kw):
    return LoraConfig(enabled=True, r=4, alpha=8.0, **kw)


@pytest.mark.parametrize("family,targets,skipped", [
    (Family.mistral, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, set()),
    (Family.olmoe, {"q_proj", "k_proj", "v_proj", "o_proj"}, {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}),
    (Family.gemma4_moe, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
     {"experts.gate_up_proj", "experts.down_proj"}),
])
def test_targets_are_attention_and_dense_mlp_linears_and_fused_experts_are_reported(build, family, targets, skipped):
    b = build(family, lora=_lora())
    info = b.info["lora"]
    assert {t.rsplit(".", 1)[-1] for t in info["targets"]} == targets
    assert {s.split("layers.*.", 1)[-1] for s in info["skipped_fused_expert_params"]} == skipped
    assert not any("router" in t or "lm_head" in t for t in info["targets"])
    if family == Family.gemma4_moe:  # a router is a Linear too, and must not be adapted
        assert "model.layers.*.router.proj" in info["not_adapted_linears"]
    trainable = {n for n, p in b.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert b.info["params_trainable"] == sum(p.numel() for p in b.model.parameters() if p.requires_grad)


def test_a_peft_kwarg_the_installed_peft_does_not_accept_is_refused_by_name(build, monkeypatch):
    import align.models.lora as lora_mod

    real = lora_mod.lora_kwargs
    monkeypatch.setattr(lora_mod, "lora_kwargs", lambda *a: {**real(*a), "lora_dropuot": 0.1})
    with pytest.raises(ConfigError, match="model.lora.*lora_dropuot"):
        build(Family.mistral, lora=_lora())


def _train(b, tokenizer, steps: int, lr: float = 1e-2, freeze_b: bool = False):
    if freeze_b:
        for n, p in b.model.named_parameters():
            if "lora_B" in n:
                p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in b.model.parameters() if p.requires_grad], lr=lr)
    b.model.train()
    for step in range(1, steps + 1):
        ids, _ = batch(len(tokenizer), seed=step)
        b.model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
        b.runtime.on_step(step)


@pytest.mark.parametrize("family", [Family.mistral, Family.olmoe])
def test_inert_adapter_gate_passes_when_adapters_train_and_halts_when_they_do_not(build, family, tokenizer):
    ok = build(family, lora=_lora(gate_steps=2))
    _train(ok, tokenizer, 2)
    assert ok.runtime.lora_gate.passed is True
    frozen = build(family, lora=_lora(gate_steps=2))
    with pytest.raises(InertAdapterError, match=r"after 2 optimizer steps .* lora_B .* still exactly zero"):
        _train(frozen, tokenizer, 3, freeze_b=True)
    no_lr = build(family, lora=_lora(gate_steps=1))
    with pytest.raises(InertAdapterError):
        _train(no_lr, tokenizer, 1, lr=0.0)


def test_qlora_is_refused_for_fused_expert_moe_families_and_needs_a_checkpoint(build):
    for fam in (Family.olmoe, Family.gemma4_moe):
        with pytest.raises(ConfigError, match=r"model.lora.qlora: QLoRA is refused .*fused 3-D"):
            build(fam, lora=_lora(qlora=True))
    with pytest.raises(ConfigError, match="model.pretrained"):
        build(Family.mistral, lora=_lora(qlora=True))


def test_qlora_dense_trains_on_a_4bit_base_and_exports_merged_full_precision_weights(build, tokenizer, tmp_path):
    import bitsandbytes as bnb
    from safetensors.torch import load_file

    from align.models.export import export_hf

    base_dir = tmp_path / "base"
    base = build(Family.mistral).model
    base.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    q = build(Family.mistral, pretrained=str(base_dir), lora=_lora(qlora=True))
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in q.model.modules())
    assert all("lora_" in n for n, p in q.model.named_parameters() if p.requires_grad)
    _train(q, tokenizer, 2)
    q_proj = "base_model.model.model.layers.0.self_attn.q_proj"
    lora_a = dict(q.model.named_parameters())[f"{q_proj}.lora_A.default.weight"].detach().float()
    lora_b = dict(q.model.named_parameters())[f"{q_proj}.lora_B.default.weight"].detach().float()
    export_hf(q.model, tokenizer, tmp_path / "export")
    w = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert all(t.dtype.is_floating_point for t in w.values()) and not any("lora" in k for k in w)
    expect = base.model.layers[0].self_attn.q_proj.weight.detach() + (8.0 / 4) * lora_b @ lora_a
    assert torch.allclose(w["model.layers.0.self_attn.q_proj.weight"].float(), expect, atol=1e-6)
    assert "quantization_config" not in (tmp_path / "export" / "config.json").read_text()


def test_preflight_checks_the_peft_and_bnb_kwargs_by_name_before_any_model_load(compose, monkeypatch):
    import align.models.lora as lora
    import align.run.kwargs_sites as checks
    from align.config import to_typed
    from align.core.signatures import KwargsSite
    from align.run.checklist import Status
    from align.run.kwargs_sites import check_site

    cfg = to_typed(compose(["model=mistral", "model.lora.enabled=true", "model.lora.qlora=true"]))
    for site in (checks.lora_site(cfg), checks.qlora_site(cfg)):
        assert check_site("x", site).status == Status.passed, site
    real = lora.lora_kwargs
    monkeypatch.setattr(lora, "lora_kwargs", lambda *a: {**real(*a), "lora_dropuot": 0.1})
    bad = check_site("peft LoraConfig", checks.lora_site(cfg))
    assert bad.status == Status.failed and "['lora_dropuot']" in bad.detail and bad.key == "model.lora"
    assert checks.lora_site(to_typed(compose(["model=mistral"]))) is None
    assert isinstance(checks.lora_site(cfg), KwargsSite)


def test_applying_lora_warns_nothing(build):
    """peft reads transformers' deprecated `is_gradient_checkpointing`; align's LoRA build says nothing of it."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        b = build(Family.mistral, lora=_lora())
    assert b.info["lora"]["targets"]
    # What a plain run would print: Python shows no DeprecationWarning raised outside __main__.
    hidden = (DeprecationWarning, PendingDeprecationWarning)
    shown = [str(w.message) for w in seen if not issubclass(w.category, hidden)]
    assert shown == []
