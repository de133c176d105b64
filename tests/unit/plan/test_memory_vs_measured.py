"""The training-memory estimate held against peaks measured on the GPU: every row composes a documented
config, estimates it on the CPU from the config alone (the model is built on the meta device, nothing at
full size) and must land within +-25% of the measured `torch.cuda.max_memory_allocated`. A config that
fits is then not refused, and one that does not is refused by preflight before anything is loaded."""

from __future__ import annotations

import pytest
import torch

from align.config import to_typed
from align.errors import ConfigError
from align.plan import memory
from align.plan.memory import GiB, estimate_memory

GEMMA4_26B_LORA = ["model=gemma4_moe", "model.preset=full", "model.dtype=bfloat16", "model.init_on_device=true",
                   "model.lora.enabled=true", "parallel.activation_checkpointing=true",
                   "trainer.loss_chunk_tokens=4096", "sampler=budget", "sampler.max_tokens=8192",
                   "sampler.mask_padding=false", "sampler.bucket_size=100000", "data=tokens", "data.path=rows.jsonl",
                   "data.max_seq_len=4096", "trainer.export=false"]

# Measured peaks (GiB, torch.cuda.max_memory_allocated), one NVIDIA H200, torch 2.11.0+cu130, transformers 5.24.0.
# Source: docs/benchmarks/log.md, each row's section and the commit of the command that measured it; the
# estimate-vs-measured table there (section "The memory estimate against measured peaks") lists the same rows.
MEASURED = [
    # "The table (2026-11-30, one command, code at commit dcf697f)": the dense bench
    ("dense_best", ["experiment=bench/dense_best"], 46.6),
    ("dense_eager", ["experiment=bench/dense_eager"], 62.8),
    ("dense_shuffle", ["experiment=bench/dense_shuffle"], 85.8),
    ("dense_bucket", ["experiment=bench/dense_bucket"], 65.1),
    # same section, the command at d964e04
    ("dense_best_32k", ["experiment=bench/dense_best_32k"], 58.3),
    # "MoE: OLMoE-1B-7B at full size": "Compiled blocks (2026-11-30)" at dcf697f
    ("moe_step_fill", ["experiment=bench/moe_step_fill"], 72.5),
    ("moe_fast", ["experiment=bench/moe_fast"], 65.9),
    ("moe_ac_32k_quarter", ["experiment=bench/moe_ac_32k_quarter"], 120.0),
    ("moe_ac_32k_fast", ["experiment=bench/moe_ac_32k_fast"], 102.0),
    # same table at d65fc09
    ("moe_ac_32k_half_fast", ["experiment=bench/moe_ac_32k_half_fast"], 83.6),
    # "Optimizer levers, eager blocks (2026-11-30)" at d2efc11
    ("moe_compiled_accum4", ["experiment=bench/moe_compiled_accum4"], 85.9),
    ("moe_ac_32k", ["experiment=bench/moe_ac_32k"], 60.3),
    # "The first MoE table (2026-11-30)" at 6617ac1 / 6512622
    ("moe_step_8k", ["experiment=bench/moe_step_8k"], 69.3),
    # "Large vocabularies (2026-11-30, code at b29b5cb)": Gemma-4 small, 262,144-token vocabulary
    ("vocab_full_logits", ["experiment=bench/vocab_full_logits"], 84.9),
    ("vocab_chunked", ["experiment=bench/vocab_chunked"], 30.4),
    # "The memory estimate against measured peaks": Gemma-4 26B-A4B LoRA SFT, 2026-12-01
    ("gemma4_26b_lora_budget8k", GEMMA4_26B_LORA, 65.0),
    # "Gemma-4 26B-A4B LoRA", the kept attention=layered with compiled blocks, 2026-12-01 at 65f0955
    ("gemma4_lora_layered", ["experiment=bench/gemma4_lora_layered"], 64.9),
    # "Gemma-4 26B-A4B LoRA", "Past the kept layered arm", 2026-12-01: the 16,384 budget at 11f9c59;
    # no activation checkpointing with the windowed flash path and the chunked CE taking its gradients in
    # its forward at c52572b, and the default's resolved 4,096 budget in the same command
    ("gemma4_lora_layered_16k", ["experiment=bench/gemma4_lora_layered_16k"], 66.3),
    ("gemma4_lora_noac", ["experiment=bench/gemma4_lora_noac"], 104.8),
    ("gemma4_lora_default", ["experiment=bench/gemma4_lora_default", "sampler.max_tokens=4096",
                             "trainer.loss_chunk_tokens=0"], 82.5),  # what the default resolved to then
    # "Fast by default", the MoE half, 2026-12-01 at 152e358: budget auto resolved to 16,384 there
    ("moe_default", ["experiment=bench/moe_default", "sampler.max_tokens=16384", "model.allow_over_memory=false"],
     86.2),
    # "Past the kept layered arm", commands 11 and 12 (2026-12-01, cd42d61 and d0f7dad): the defaults as they
    # resolve now (Gemma-4: budget 8,192 and chunk 2,048; OLMoE: budget 20,480 under the compiled headroom),
    # and the 16,384 budget under the partitioner's memory budget
    ("gemma4_lora_default_resolved", ["experiment=bench/gemma4_lora_default", "sampler.max_tokens=8192"], 104.8),
    ("moe_default_20k", ["experiment=bench/moe_default", "sampler.max_tokens=20480", "model.allow_over_memory=false"],
     98.2),
    ("gemma4_lora_16k_budget", ["experiment=bench/gemma4_lora_16k_budget"], 102.6),
    # the default with 16,384-token rows allowed, as auto resolved it, on rows of up to 16,384 tokens
    ("gemma4_lora_16k_rows", ["experiment=bench/gemma4_lora_16k_rows", "sampler.max_tokens=16384",
                              "trainer.compile_memory_budget=0.5"], 101.7),
    # "Gemma-4 26B-A4B LoRA", "Past the kept layered arm", command 18 (2026-12-02, f81fa8a): the default
    # with trainer.compile_loss resolved on; "Fast by default", commands 20 and 21 (2026-12-02, f81fa8a and
    # 6181692): the dense default (budget auto -> 32,768) and the dense bench with the chunked loss
    ("gemma4_lora_default_compiled_loss", ["experiment=bench/gemma4_lora_default", "sampler.max_tokens=8192"], 99.8),
    ("dense_best_chunk", ["experiment=bench/dense_best_chunk"], 37.9),
    ("dense_default", ["experiment=bench/dense_default", "sampler.max_tokens=32768"], 56.4),
]
H200_BYTES = 143_771 * 1024**2  # the device's total memory as docs/performance.md records it


def _cfg(compose, *ov: str):
    """The row's config with `trainer.loss_chunk_tokens=auto` resolved as on the GPU it ran on (every
    auto row ran at 0 there: its ratio is below the threshold, as test_chunk_auto.py holds), and the
    partitioner at torch's default, as every row without a budget of its own ran."""
    from align.plan.budget_auto import plan_memory_budget
    from align.plan.chunk_auto import plan_loss_chunk

    cfg = plan_loss_chunk(to_typed(compose(["allow_dirty=true", *ov])), torch.device("cuda"))[0]
    return plan_memory_budget(cfg, torch.device("cpu"))[0]  # auto is torch's default off CUDA


@pytest.mark.parametrize("name,overrides,peak_gib", MEASURED, ids=[r[0] for r in MEASURED])
def test_estimate_is_within_25_percent_of_the_measured_peak(compose, name, overrides, peak_gib):
    cfg = _cfg(compose, *overrides)
    est = estimate_memory(cfg, torch.device("cuda"))  # arithmetic only: no CUDA needed
    ratio = est.total / GiB / peak_gib
    assert 0.75 <= ratio <= 1.25, f"{name}: estimate {est.total / GiB:.1f} GiB vs measured {peak_gib} GiB " \
                                  f"({ratio:.2f}x): {est.line()}"
    # it ran on an H200, so preflight must let it start there without the override
    assert not cfg.model.allow_over_memory and est.total <= H200_BYTES, est.line()


def test_the_budget_search_headroom_is_one_the_measured_error_allows(compose):
    """`sampler.max_tokens=auto` lets the estimate fill a share of the device by how the blocks run
    (align/plan/budget_auto.py). A configuration whose estimate sits at that share and errs as a
    measured row of its kind does must still peak below PEAK_SHARE of the device. The shuffle and
    bucket samplers take no budget, so their rows do not bound the search."""
    from align.config import SamplerKind
    from align.plan.budget_auto import PEAK_SHARE, headroom

    worst: dict[str, tuple[float, str]] = {}
    for name, overrides, peak_gib in MEASURED:
        cfg = _cfg(compose, *overrides)
        if cfg.sampler.kind != SamplerKind.budget:
            continue
        share, kind = headroom(cfg, torch.device("cuda"))
        reach = share / (estimate_memory(cfg, torch.device("cuda")).total / GiB / peak_gib)
        worst[kind] = max(worst.get(kind, (0.0, "")), (reach, name))
    assert set(worst) == {"compiled", "eager"}, worst  # both shares are held by rows of their kind
    for kind, (reach, name) in worst.items():
        assert reach <= PEAK_SHARE, f"{kind} blocks: {name}'s error puts an estimate at the headroom at " \
                                    f"{reach:.3f} of the device, over {PEAK_SHARE}"


def _gemma(rows, max_tokens: int) -> list[str]:
    swap = {"sampler.max_tokens": f"sampler.max_tokens={max_tokens}", "data.path": f"data.path={rows}"}
    return [swap.get(o.split("=")[0], o) for o in GEMMA4_26B_LORA]


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"input_ids": [1, 2, 3]}\n')
    return path


def test_the_gemma4_26b_lora_config_fits_an_h200_without_the_override(compose, monkeypatch, rows):
    from align.run.preflight_checks import run_preflight

    monkeypatch.setattr(memory, "device_memory", lambda device: H200_BYTES)
    cfg = _cfg(compose, *_gemma(rows, 8192))
    assert not cfg.model.allow_over_memory
    line = [c for c in run_preflight(cfg) if c.name == "params and memory"][0].detail
    assert "8192 tokens per micro-batch" in line and "allowed by" not in line, line


def test_a_config_that_cannot_fit_is_refused_before_load_in_one_line(compose, monkeypatch, capsys, rows):
    from align.run.cli import preflight_command_line
    from align.run.preflight_checks import run_preflight

    monkeypatch.setattr(memory, "device_memory", lambda device: H200_BYTES)
    big = _gemma(rows, 262144)
    with pytest.raises(ConfigError, match=r"model.allow_over_memory: the training-memory estimate does not fit"):
        run_preflight(_cfg(compose, *big))
    with pytest.raises(SystemExit) as e:  # what `python -m align.train` runs before Hydra makes a run dir
        preflight_command_line(["allow_dirty=true", *big])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "model.allow_over_memory" in err, err


def test_the_grpo_default_estimate_holds_the_engines_cache_beside_the_update(compose, monkeypatch):
    """`grpo_default` on align's engine measured 65.1 GiB at peak (2026-12-03, 5c0ae99; docs/benchmarks/log.md
    "align's decode engine", command D): its KV cache (18 GiB) stays allocated through the update, which an
    estimate taking the larger of the cache and the update's working set put at 45.3 GiB. The estimate, as the
    default resolves on an H200, counts the copy and the held cache and lands within +-25% of the peak."""
    from align.plan.planner import plan

    monkeypatch.setattr(memory, "device_memory", lambda device: H200_BYTES)
    job = plan(to_typed(compose(["allow_dirty=true", "experiment=bench/grpo_default"])), torch.device("cuda"))
    gen = job.sized.objective
    assert (gen.generation_dtype.value, gen.generation_batch_size) == ("bf16", 512)
    est = job.estimate  # at the rollout's real width: the longest prompt + max_new_tokens
    assert est.generation_copy > 0 and est.kv_cache > 0 and est.kv_cache_held, est.line()
    assert 0.75 * 65.1 * GiB <= est.total <= min(1.25 * 65.1 * GiB, H200_BYTES), est.line()
