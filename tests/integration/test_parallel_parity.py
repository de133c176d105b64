"""parallel=fsdp and parallel=ep on 2 gloo ranks train the same model a single process trains.

Single process: micro-batches of 2 rows, 2 per window. Two ranks: 1 micro-batch each per window; rank r
takes every other global micro-batch, so together they see exactly the single process's window, and
the loss is averaged per loss token over the whole window ACROSS ranks. Losses of 5 optimizer steps
must agree to 1e-5 in fp32. One spawn of 2 processes runs both parallel kinds (imports paid once),
and a LoRA run under fsdp: its adapters train past the inert-adapter gate, and its export (gathered
from the shards) holds a peft adapter that, on the run's starting weights, equals the merged model.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import bundled_tokenizer
from tests.integration.distributed import TINY, fit, fit_many, history, result, run

STEPS = 5
JOBS = {
    "fsdp": ["model=mistral", "parallel=fsdp"],
    "ep": ["model=olmoe", "parallel=ep"],
    "fsdp_lora": ["model=mistral", "parallel=fsdp", "model.lora.enabled=true", "model.lora.gate_steps=2",
                  "trainer.export=true"],
}


def _overrides(extra: list[str], accum: int) -> list[str]:
    return TINY + [f"trainer.max_steps={STEPS}", f"trainer.grad_accum={accum}", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    jobs = [{"run_dir": str(root / k), "overrides": _overrides(v, 1)} for k, v in JOBS.items()]
    codes = run(fit_many, 2, jobs, str(root / "codes.json"), timeout=420)
    assert codes == [0, 0], f"rank exit codes {codes}"
    assert json.loads((root / "codes.json").read_text()) == [0] * len(JOBS)
    for family, kind in (("mistral", "fsdp"), ("olmoe", "ep")):  # the single-process references
        assert fit(0, 1, str(root / f"single_{kind}"), _overrides([f"model={family}"], 2)) == 0
    return root


@pytest.mark.parametrize("kind", ["fsdp", "ep"])
def test_two_ranks_match_one_process_to_1e5(runs, kind):
    ref, got = history(runs / f"single_{kind}"), history(runs / kind)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)) == [r["step"] for r in ref]
    for a, b in zip(ref, got):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * a["grad_norm"], (a["step"], a["grad_norm"], b["grad_norm"])
        # the window really was the whole single-process window: same token counts, all ranks
        assert (a["tokens"], a["real_tokens"], a["loss_tokens"]) == (b["tokens"], b["real_tokens"], b["loss_tokens"])
    assert ref[-1]["loss"] < ref[0]["loss"]  # it trains, so the comparison is of a moving model


def test_sharding_was_applied_as_recorded(runs):
    fsdp = result(runs / "fsdp", 0)["model_info"]
    assert fsdp["parallel"]["kind"] == "fsdp" and fsdp["parallel"]["grad_scale"] == 2
    assert fsdp["parallel"]["fsdp_blocks"] == 2 and fsdp["parallel"]["fsdp_block_class"] == "MistralDecoderLayer"
    ep = result(runs / "ep", 1)["model_info"]["parallel"]
    assert ep["ep_size"] == 2 and ep["ep_implementation"] == "all_to_all"
    assert set(ep["ep_plan"].values()) == {"grouped_gemm", "ep_dispatch_experts"}
    # the single-process reference ran plain AdamW and says so (adamw8bit under FSDP: test_resume_exact)
    assert result(runs / "single_fsdp", 0)["model_info"]["optimizer_impl"] == "torch.optim.adamw.AdamW"


def test_lora_under_fsdp_trains_and_exports_an_adapter_equal_to_its_merged_model(runs):
    import torch
    from peft import PeftModel

    from align.config import Family, to_typed
    from align.models.adapter import base_model
    from align.models.roundtrip import compare, load_export, outputs
    from align.run.cli import compose

    d = runs / "fsdp_lora"  # exit 0 (fixture): the gate at step 2 saw the adapters the optimizer moved
    cfg = to_typed(compose(_overrides(JOBS["fsdp_lora"], 1)))
    ids = torch.randint(3, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    base = base_model(cfg, bundled_tokenizer())
    before = outputs(base, Family.mistral, ids)
    adapted = outputs(PeftModel.from_pretrained(base, d / "export" / "adapter"), Family.mistral, ids)
    rep = compare(outputs(load_export(d / "export", Family.mistral), Family.mistral, ids), adapted)
    assert rep.passed, rep.line()
    assert (adapted.logits - before.logits).abs().max() > 1e-3
