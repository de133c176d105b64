"""One plan per job (align/plan/planner.py): a run through `python -m align.train`'s entry, in this process,
makes one Plan, and preflight's memory check, the manifest's serving viability and sizes and the trainer
all read that one."""

from __future__ import annotations

import logging
import sys

import pytest


@pytest.fixture
def plans(monkeypatch):
    """Every Plan made while the test runs, however its maker was imported."""
    from align.plan import planner

    made = []
    real = planner.Plan.__init__

    def counting(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(planner.Plan, "__init__", counting)
    return made


@pytest.fixture
def sizings(monkeypatch):
    """The objective each sizing of a config was asked for by: `plan_sizes` reads the rollouts' width first
    (a module global, so a plan_sizes imported anywhere, a Plan or none, is seen)."""
    from align.plan import budget_auto

    asked = []
    real = budget_auto.plan_rollout

    def counting(cfg):
        asked.append(cfg.objective)
        return real(cfg)

    monkeypatch.setattr(budget_auto, "plan_rollout", counting)
    return asked


@pytest.fixture
def hydra_logging():
    """The job's logging as Hydra configures it in this process, put back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_run_through_align_train_plans_once_and_every_reader_takes_that_plan(tmp_path, monkeypatch, plans, sizings,
                                                                                  hydra_logging):
    import align.train
    from align.run.manifest import load

    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["align.train", f"hydra.run.dir={run_dir}", "allow_dirty=true", "logger=none",
                                      "trainer.max_steps=1", "data.max_records=16", "trainer.export=false"])
    align.train.main()  # the entry `python -m align.train` runs: preflight before Hydra, then the Hydra job
    assert len(plans) == 1, [str(p.device) for p in plans]  # preflight's; the manifest and the trainer reuse it
    assert len(sizings) == 1  # and no reader sizes the config on its own
    [job] = plans
    m = load(run_dir)
    assert m["run"]["exit_code"] == 0
    [check] = [c for c in m["preflight"] if c["name"] == "params and memory"]
    assert check["detail"] == job.estimate.line()  # preflight's memory check
    assert m["serving"]["viability"]["estimate_bytes"] == job.estimate.total  # the serving viability
    for key in ("sampler_budget", "loss_chunk", "memory_budget"):  # the sizes Trainer.build took
        assert m[key] == job.sizes[key], key
    assert {k: m["compile"][k] for k in ("trainer", "optimizer", "loss")} == job.compile
