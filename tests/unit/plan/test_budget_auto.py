"""sampler.max_tokens=auto (align/plan/budget_auto.py): what it resolves to per device, and that an
unresolved auto never reaches a sampler, an estimate or a resume identity."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from align.config import to_typed
from align.errors import ConfigError
from align.plan.budget_auto import HEADROOM, STEP, plan_budget, plan_sizes

GiB = 2**30
H200 = int(139.8 * GiB)
CUDA = torch.device("cuda")


def _cfg(compose, *ov):
    return to_typed(compose(["allow_dirty=true", *ov]))


def _cuda(compose, *ov):
    """A config with `trainer.loss_chunk_tokens` and `trainer.compile_memory_budget` resolved for an H200,
    as plan_sizes hands the budget search one."""
    from align.plan.budget_auto import plan_memory_budget
    from align.plan.chunk_auto import plan_loss_chunk

    return plan_memory_budget(plan_loss_chunk(_cfg(compose, *ov), CUDA)[0], CUDA, H200)[0]


def _estimate(cfg, tokens):
    from align.plan.memory import estimate_memory

    return estimate_memory(dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, max_tokens=tokens)),
                           CUDA).total


def test_the_default_sampler_is_a_full_sort_token_budget_resolved_on_a_cpu_to_the_base_step(compose):
    cfg = _cfg(compose)
    s = cfg.sampler
    assert (s.kind.value, s.max_tokens, s.bucket_size, s.pad_to_multiple_of, s.mask_padding) == (
        "budget", "auto", 100000, 8, False)
    resolved, record = plan_budget(cfg, torch.device("cpu"))
    assert resolved.sampler.max_tokens == STEP == 4096 and cfg.sampler.max_tokens == "auto"
    assert record["requested"] == "auto" and record["resolved"] == 4096 and "on cpu" in record["why"]


def test_on_a_cpu_auto_never_falls_below_the_longest_record(compose):
    _, record = plan_budget(_cfg(compose, "data.max_seq_len=5000"), torch.device("cpu"))
    assert record["resolved"] == 5000  # 5000 is a multiple of pad_to_multiple_of=8


def test_on_an_h200_the_dense_bench_model_takes_the_largest_budget_whose_estimate_fits(compose):
    cfg = _cuda(compose, "experiment=bench/dense_default")
    _, record = plan_budget(cfg, CUDA, device_bytes=H200)
    tokens = record["resolved"]
    assert tokens % STEP == 0 and STEP <= tokens <= 8 * STEP
    assert _estimate(cfg, tokens) <= HEADROOM["compiled"] * H200
    assert tokens == 8 * STEP or _estimate(cfg, tokens + STEP) > HEADROOM["compiled"] * H200  # the largest that fits
    assert tokens == 32768 and "0.85 x 139.8 GiB (compiled blocks)" in record["why"]


def test_the_moe_bench_model_stops_where_its_estimate_would_pass_the_headroom(compose):
    cfg = _cuda(compose, "experiment=bench/moe_default")
    _, record = plan_budget(cfg, CUDA, device_bytes=H200)
    tokens = record["resolved"]
    assert _estimate(cfg, tokens) <= HEADROOM["compiled"] * H200 < _estimate(cfg, tokens + STEP)


def test_eager_blocks_get_the_smaller_share_of_the_device(compose):
    """The estimate undercounts what eager blocks keep (tests/unit/plan/test_memory_vs_measured.py
    holds both shares to the measured peaks), so the same model without compiled blocks stops earlier."""
    compiled = _cuda(compose, "experiment=bench/moe_default")
    eager = _cuda(compose, "experiment=bench/moe_default", "trainer.compile=false")
    _, fast = plan_budget(compiled, CUDA, device_bytes=H200)
    _, slow = plan_budget(eager, CUDA, device_bytes=H200)
    assert "(compiled blocks)" in fast["why"] and "(eager blocks)" in slow["why"]
    assert _estimate(eager, slow["resolved"]) <= HEADROOM["eager"] * H200 < _estimate(eager, slow["resolved"] + STEP)
    assert slow["resolved"] < fast["resolved"]
    off_cuda = _cuda(compose, "experiment=bench/moe_default", "optimizer.overlap=true", "optimizer.compile=false")
    assert "(eager blocks)" in plan_budget(off_cuda, CUDA, device_bytes=H200)[1]["why"]  # auto resolved off


def test_on_a_device_too_small_for_any_step_auto_is_the_longest_record(compose):
    cfg = _cuda(compose, "experiment=bench/dense_default", "data.max_seq_len=4000")
    _, record = plan_budget(cfg, CUDA, device_bytes=GiB)
    assert record["resolved"] == 4000 and "longest record" in record["why"]


def test_a_given_budget_is_kept_and_a_sampler_without_one_has_no_record(compose):
    cfg, record = plan_budget(_cuda(compose, "sampler.max_tokens=3000"), CUDA, device_bytes=GiB)
    assert cfg.sampler.max_tokens == 3000 and record == {"requested": 3000, "resolved": 3000,
                                                         "why": "sampler.max_tokens as given"}
    assert plan_budget(_cfg(compose, "sampler=shuffle"), CUDA)[1] is None
    assert plan_budget(_cfg(compose, "objective=grpo"), CUDA)[1] is None  # grpo keeps the shuffle sampler


@pytest.mark.parametrize("bad", ["lots", "0", "true", "-4"])
def test_a_budget_that_is_no_int_and_not_auto_is_refused(compose, bad):
    with pytest.raises(ConfigError) as e:
        _cfg(compose, f"sampler.max_tokens={bad}")
    assert e.value.key == "sampler.max_tokens" and "auto" in e.value.message


def test_an_unresolved_auto_reaches_no_sampler_estimate_or_identity(compose):
    from align.control.resume import run_identity
    from align.data.samplers import build_sampler
    from align.plan.memory import estimate_memory

    cfg = _cfg(compose)
    with pytest.raises(ValueError, match="unresolved"):
        build_sampler(cfg.sampler, np.array([5, 9, 3]), 0)
    with pytest.raises(ValueError, match="unresolved"):
        estimate_memory(cfg, torch.device("cpu"))
    with pytest.raises(ValueError, match="unresolved"):
        run_identity(cfg, 1, None, None)


def test_grpo_keeps_shuffle_and_still_composes_with_the_budget_sampler(compose):
    assert _cfg(compose, "objective=grpo").sampler.kind.value == "shuffle"
    cfg = _cfg(compose, "objective=grpo", "sampler=budget", "sampler.max_tokens=4096")
    assert cfg.sampler.kind.value == "budget" and cfg.sampler.bucket_size == 64


def test_the_search_builds_the_meta_model_once(compose, monkeypatch):
    """Nine estimates (eight candidates and the pick) read one meta model: building it per estimate
    made a run's start pay the model construction nine times over (more with the preflight's own)."""
    import align.plan.memory as memory

    built = []
    real = memory._build_meta_model
    monkeypatch.setattr(memory, "_build_meta_model", lambda m: built.append(m) or real(m))
    monkeypatch.setattr(memory, "_META", {})
    cfg = _cfg(compose, "experiment=bench/dense_default")
    plan_sizes(cfg, CUDA, device_bytes=H200)  # the chunk's ratio reads it too
    plan_sizes(cfg, CUDA, device_bytes=H200)
    assert len(built) == 1
    other = _cfg(compose, "experiment=bench/dense_default", "model.overrides.num_hidden_layers=2")
    assert memory.meta_model(other.model)[1].num_hidden_layers == 2 and len(built) == 2  # the key is the config


GEMMA4_DEFAULT = "experiment=bench/gemma4_lora_default"


def _chunked(cfg):
    from align.plan.chunk_auto import plan_loss_chunk

    return plan_loss_chunk(cfg, CUDA)[0]  # the memory budget's estimates count the chunk, resolved first


def test_compile_memory_budget_auto_is_torchs_default_where_the_longest_record_fits(compose):
    from align.plan.budget_auto import plan_memory_budget

    cfg = _cfg(compose, GEMMA4_DEFAULT)
    assert cfg.trainer.compile_memory_budget == "auto"
    _, rec = plan_memory_budget(_chunked(cfg), CUDA, H200)
    assert rec["resolved"] is None and "the least micro-batch fits" in rec["why"]
    _, rec = plan_memory_budget(cfg, torch.device("cpu"))
    assert rec["resolved"] is None and "on cpu" in rec["why"]
    _, rec = plan_memory_budget(_chunked(_cfg(compose, GEMMA4_DEFAULT, "trainer.compile=false")), CUDA, H200)
    assert rec["resolved"] is None and "eager blocks" in rec["why"]
    _, rec = plan_memory_budget(_chunked(_cfg(compose, GEMMA4_DEFAULT, "trainer.compile_memory_budget=0.3")), CUDA,
                                H200)
    assert rec == {"requested": 0.3, "resolved": 0.3, "why": "trainer.compile_memory_budget as given"}


def test_rows_too_long_for_the_saved_activations_get_the_largest_share_that_fits(compose, monkeypatch):
    """16,384-token rows on the Gemma-4 26B-A4B LoRA default: the partitioner keeps the largest tenth of
    its activations that fits, and the run resolves to gemma4_lora_16k_budget, the arm measured at that
    budget (docs/performance.md#gemma-4-26b-a4b-lora)."""
    from align.plan import memory
    from align.plan.budget_auto import headroom
    from align.plan.compile_auto import resolve_compile

    monkeypatch.setattr(memory, "device_memory", lambda device: H200)
    cfg = _cfg(compose, GEMMA4_DEFAULT, "data.max_seq_len=16384")
    resolved, sizes = plan_sizes(cfg, CUDA, H200)
    assert sizes["memory_budget"]["resolved"] == 0.5 and sizes["sampler_budget"]["resolved"] == 16384
    share, _ = headroom(resolved, CUDA)
    wider = dataclasses.replace(resolved, trainer=dataclasses.replace(resolved.trainer, compile_memory_budget=0.6))
    assert memory.estimate_memory(resolved, CUDA).total <= share * H200 < memory.estimate_memory(wider, CUDA).total
    arm, _ = plan_sizes(_cfg(compose, "experiment=bench/gemma4_lora_16k_budget"), CUDA, H200)
    ours, theirs = resolve_compile(resolved, "cuda")[0], resolve_compile(arm, "cuda")[0]
    for group in ("trainer", "sampler", "parallel", "optimizer"):
        assert getattr(ours, group) == getattr(theirs, group), group


def test_where_no_share_fits_auto_leaves_the_refusal_to_preflight(compose):
    from align.plan.budget_auto import plan_memory_budget

    _, rec = plan_memory_budget(_chunked(_cfg(compose, GEMMA4_DEFAULT, "data.max_seq_len=16384")), CUDA, 60 * GiB)
    assert rec["resolved"] is None and "no share fits" in rec["why"]
