"""Pieces of align.parallel that need no process group: gradient clipping, hang diagnostics, rank
overrides, the expert plan, the optimizer choice, decoder blocks, disjoint rows per rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from align.config import (
    Device,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    ParallelKind,
    SamplerConfig,
    SamplerKind,
)
from align.errors import ConfigError
from align.parallel.env import hang_diagnostics_env, init_distributed
from align.parallel.grad import clip_grad_norm_
from align.parallel.launch import rank_overrides


def _params(*grads):
    ps = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g.clone()
        ps.append(p)
    return ps


def test_grad_norm_is_exact_and_clipping_scales_to_max():
    g = [torch.full((1000,), 0.1), torch.full((3, 7), -2.0)]
    exact = math.sqrt(sum(float(x.double().square().sum()) for x in g))
    ps = _params(*g)
    assert clip_grad_norm_(ps, 0) == pytest.approx(exact, rel=1e-15)
    assert all(torch.equal(p.grad, x) for p, x in zip(ps, g))  # <= 0: measure only
    assert clip_grad_norm_(ps, 1.0) == pytest.approx(exact, rel=1e-15)
    assert math.sqrt(sum(float(p.grad.double().square().sum()) for p in ps)) == pytest.approx(1.0, rel=1e-5)


def test_a_nonfinite_norm_is_reported_and_grads_are_left_for_the_skip():
    ps = _params(torch.tensor([1.0, float("nan")]), torch.ones(3))
    assert math.isnan(clip_grad_norm_(ps, 1.0))
    assert torch.equal(ps[1].grad, torch.ones(3))


@pytest.mark.parametrize("clipped", [True, False])
def test_fused_adamw_applies_the_clip_in_its_own_kernel_as_an_explicit_clip_would(clipped):
    """With torch's fused AdamW the clip coefficient rides in `optimizer.grad_scale` (no extra pass
    over the gradients); the update must equal clip-then-step with the unfused optimizer."""
    from align.parallel.grad import folds_clipping

    torch.manual_seed(0)
    g = [torch.randn(64, 32) * 3, torch.randn(17) * 5]
    max_norm = 1.0 if clipped else 1e6
    results = []
    for fused in (True, False):
        ps = _params(*g)
        opt = torch.optim.AdamW(ps, lr=0.1, eps=1.0, fused=fused)  # eps 1: the update depends on the scale
        assert folds_clipping(opt) == fused
        for size in (1.0, 1e-3):  # clipped, then (norm ~0.1) not: the first step's scale must not linger
            for p, x in zip(ps, g):
                p.grad = x * size
            clip_grad_norm_(ps, max_norm, opt)
            opt.step()
        results.append([p.detach().clone() for p in ps])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    moved = [float((a - b).abs().max()) for a, b in zip(results[0], _params(*g))]
    assert min(moved) > 1e-3  # both steps moved every parameter (lr 0.1): the comparison is not vacuous


def test_hang_diagnostics_use_the_flight_recorder_names_of_torch_2_11(tmp_path):
    env = hang_diagnostics_env(ParallelConfig(flight_recorder_entries=500), tmp_path, 3)
    assert env["TORCH_FR_BUFFER_SIZE"] == "500" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(str((tmp_path / "rank3" / "flight_recorder").resolve()))
    assert not any("TRACE_BUFFER" in k for k in env)  # deprecated name (docs/pitfalls.md#17)
    assert hang_diagnostics_env(ParallelConfig(flight_recorder_entries=0), tmp_path, 0) == {}


def test_parallel_single_refuses_a_multi_rank_job(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError, match="parallel.kind: .*use parallel=fsdp"):
        init_distributed(ParallelConfig(kind=ParallelKind.single), Device.cpu, tmp_path)


def test_only_rank_0_writes_hydra_files(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    assert rank_overrides() == []
    monkeypatch.setenv("RANK", "3")
    assert "hydra.output_subdir=null" in rank_overrides()


def _tiny(family: str, **over):
    from align.config import Family
    from tests.conftest import build_tiny

    return build_tiny(Family(family), overrides=over).model


def test_the_expert_plan_keeps_only_expert_rules_that_name_something():
    from align.parallel.ep import expert_plan
    from align.parallel.fsdp import decoder_blocks

    olmoe = _tiny("olmoe")
    plan = expert_plan(olmoe)
    assert set(plan.values()) == {"grouped_gemm", "ep_dispatch_experts"} and all("experts" in k for k in plan)
    assert len(decoder_blocks(olmoe)) == 2
    assert expert_plan(_tiny("mistral")) == {}
    gemma_moe = _tiny("gemma4", enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    plan = expert_plan(gemma_moe)
    assert "ep_dispatch_experts" in plan.values() and "colwise" not in plan.values()  # dense-MLP TP rules dropped
    assert "colwise" in gemma_moe.ep_plan.values()  # ...which transformers' own plan has


def test_adamw8bit_is_torchao_on_dtensors_and_bitsandbytes_otherwise():
    from align.optim import optimizer_class

    cfg = OptimizerConfig(name=OptimizerName.adamw8bit)
    assert optimizer_class(cfg, sharded=True).__module__.startswith("torchao.optim")
    assert optimizer_class(cfg, sharded=False).__module__.startswith("bitsandbytes")
    assert optimizer_class(OptimizerConfig(), sharded=True) is torch.optim.AdamW


@pytest.mark.parametrize("kind", [SamplerKind.shuffle, SamplerKind.bucket])
def test_ranks_draw_disjoint_rows_that_cover_the_single_process_epoch(kind):
    from align.data.samplers import build_sampler

    lengths = np.random.default_rng(0).integers(10, 100, size=203)
    cfg = SamplerConfig(kind=kind, micro_batch_size=4, bucket_size=16)
    ranks = [build_sampler(cfg, lengths, 0, r, 2).rank_batches(0) for r in range(2)]
    rows = [set(np.concatenate(b).tolist()) for b in ranks]
    assert not rows[0] & rows[1] and len(ranks[0]) == len(ranks[1])
    single = build_sampler(cfg, lengths, 0, 0, 1).rank_batches(0)
    # global micro-batch i of the single process is micro-batch i//2 of rank i%2
    for i in range(2 * len(ranks[0])):
        assert np.array_equal(single[i], ranks[i % 2][i // 2])


def test_a_slurm_task_under_submitit_gets_torchrun_style_rank_variables(monkeypatch):
    from align.parallel.env import dist_env, export_submitit_env

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(k, "")  # (setenv records the original state, so the export is undone after the test)
        monkeypatch.delenv(k)
    slurm = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "123", "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[3-4]", "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    export_submitit_env()
    env = dist_env(Device.cpu)
    assert (env.rank, env.world, env.local_rank) == (9, 16, 1)
    import os

    assert os.environ["MASTER_ADDR"] == "gpu3" and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_the_submitit_export_did_not_leak_into_later_tests():
    import os

    assert "RANK" not in os.environ or os.environ["RANK"] != "9"


def test_adamw8bit_is_checked_and_built_as_the_class_that_will_run(monkeypatch):
    """Preflight must read the signature of the 8-bit class the run will build: torchao under
    fsdp/ep (DTensor parameters) and where bitsandbytes is not installed (the GPU image), bitsandbytes
    otherwise. Checking bitsandbytes under fsdp refused runs on machines without it."""
    import importlib.util

    from align.config import to_typed
    from align.optim import optimizer_target
    from align.run.cli import compose
    from align.run.kwargs_sites import optimizer as optimizer_site

    cfg = OptimizerConfig(name=OptimizerName.adamw8bit)
    assert optimizer_target(cfg) == "bitsandbytes.optim:AdamW8bit"
    assert optimizer_target(cfg, sharded=True) == "torchao.optim:AdamW8bit"
    fsdp = to_typed(compose(["optimizer=adamw8bit", "parallel=fsdp"]))
    assert optimizer_site(fsdp).target == "torchao.optim:AdamW8bit"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "bitsandbytes" else real(n, *a))
    assert optimizer_target(cfg) == "torchao.optim:AdamW8bit"
