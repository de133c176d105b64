"""The model runtime inside the real training loop: telemetry rows every step, the applied router
loss recorded, the LoRA gate armed, a merged export that transformers loads and an adapter that
peft loads onto the run's random-init base with the merged export's logits."""

from __future__ import annotations

import json

import torch

from align.config import to_typed


def test_moe_lora_run_logs_router_telemetry_every_step_and_exports_merged(compose, tmp_path):
    from align.run.preflight_checks import run_preflight
    from align.trainer import Trainer

    cfg = to_typed(compose(["model=olmoe", "logger=none", "trainer.max_steps=3", "trainer.grad_accum=2",
                            "data.max_records=24", "data.max_seq_len=128", "sampler=shuffle",
                            "sampler.micro_batch_size=4",
                            "model.moe.lb_weight=0.01", "model.lora.enabled=true", "model.lora.gate_steps=2",
                            "optimizer.lr=1e-2", "allow_dirty=true"]))
    names = [c.name for c in run_preflight(cfg)]
    assert {"attention resolution (align.models)", "router losses", "peft LoraConfig",
            "params and memory"} <= set(names)
    tr = Trainer.build(cfg, tmp_path)
    assert tr.fit() == 0
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for layer in (0, 1):
            for key in ("max_vio", "utilization", "dead_frac", "entropy", "lb_loss", "z_loss"):
                assert isinstance(r[f"moe/l{layer}/{key}"], float)
        assert r["moe/aux_applied"] == 0.01 * r["moe/lb_loss"]
    info = tr.model_info
    assert info["moe"]["lb_weight_applied"] == 0.01 and info["moe"]["z_weight_applied"] == 0.0
    assert info["lora_gate_passed"] is True and info["moe_heatmap"].endswith("plots/moe_expert_load.png")
    assert (tmp_path / "plots" / "moe_expert_load.png").is_file()

    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tmp_path / "export", local_files_only=True)
    assert type(m).__name__ == "OlmoeForCausalLM" and not any("lora" in n for n, _ in m.named_parameters())
    assert isinstance(m(input_ids=torch.tensor([[5, 6, 7]])).logits, torch.Tensor)

    from peft import PeftModel

    from align.config import Family
    from align.models.adapter import base_model
    from align.models.roundtrip import compare, outputs

    assert info["lora"]["export"]["adapter_base"].startswith("random init of preset tiny")
    ids = torch.randint(3, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
    base = base_model(cfg, tr.tokenizer)  # what the adapter applies to: the run's starting weights
    before = outputs(base, Family.olmoe, ids)
    adapted = outputs(PeftModel.from_pretrained(base, tmp_path / "export" / "adapter"), Family.olmoe, ids)
    rep = compare(outputs(m, Family.olmoe, ids), adapted)
    assert rep.passed, rep.line()
    assert (adapted.logits - before.logits).abs().max() > 1e-4  # three steps moved the function
