"""The job's plan (align/plan/planner.py): what its resolvers give, in their order, and a trainer takes it
only for the config and device it was made for (the run through the entry: tests/integration/test_one_plan.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from align.config import to_typed
from align.plan.planner import plan

CPU = torch.device("cpu")


def test_the_plan_is_the_sizes_then_their_estimate_then_the_compile_switches(compose):
    from align.plan.budget_auto import plan_sizes
    from align.plan.compile_auto import resolve_compile
    from align.plan.memory import estimate_memory

    cfg = to_typed(compose(["logger=none", "allow_dirty=true"]))
    job = plan(cfg, CPU)
    sized, sizes = plan_sizes(cfg, CPU)
    resolved, switches = resolve_compile(sized, "cpu")
    assert (job.requested, job.device, job.sized, job.cfg) == (cfg, CPU, sized, resolved)
    assert job.sizes == sizes and job.compile == switches and job.prompt_tokens is None
    assert job.estimate.total == estimate_memory(sized, CPU).total
    assert cfg.sampler.max_tokens == "auto" and job.cfg.sampler.max_tokens == sizes["sampler_budget"]["resolved"]


def test_a_trainer_takes_the_plan_only_for_its_config_and_device_and_gets_records_of_its_own(compose):
    cfg = to_typed(compose(["logger=none", "allow_dirty=true"]))
    job = plan(cfg, CPU)
    taken, sizes, switches = job.for_trainer(cfg, CPU)
    assert taken is job.cfg and sizes == job.sizes and switches == job.compile
    sizes["run_length"], switches["inductor_cache"] = {}, None  # what the trainer adds stays out of the plan
    assert "run_length" not in job.sizes and "inductor_cache" not in job.compile
    other = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, seed=cfg.trainer.seed + 1))
    with pytest.raises(ValueError, match="config differs"):
        job.for_trainer(other, CPU)
    with pytest.raises(ValueError, match="device cuda:1 differs"):
        job.for_trainer(cfg, torch.device("cuda", 1))


def test_the_plan_is_made_for_the_device_this_rank_trains_on(monkeypatch):
    from align.config import Device
    from align.parallel.env import dist_env, job_device

    monkeypatch.setenv("LOCAL_RANK", "1")
    assert job_device(Device.cuda) == dist_env(Device.cuda).device == torch.device("cuda", 1)
    assert job_device(Device.cpu) == CPU
