"""align's LR schedules are transformers' cosine-, linear- and constant-with-warmup, step for step and in
their state dicts, without importing transformers' Trainer utilities (and through them peft and bitsandbytes)."""

from __future__ import annotations

import inspect

import pytest
import torch

from align.config import OptimizerConfig
from align.config.trainer_config import Schedule
from align.optim import (
    build_scheduler,
    constant_with_warmup,
    cosine_with_warmup,
    linear_with_warmup,
    scheduler_factory,
    scheduler_kwargs,
)

THEIRS = {"cosine": "get_cosine_schedule_with_warmup", "linear": "get_linear_schedule_with_warmup",
          "constant": "get_constant_schedule_with_warmup"}
OURS = {"cosine": cosine_with_warmup, "linear": linear_with_warmup, "constant": constant_with_warmup}


def _theirs(schedule: str):
    import transformers

    return getattr(transformers, THEIRS[schedule])


def _lrs(factory, warmup: int, total: int, lr: float = 3e-4, **kw) -> tuple[list[float], dict]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    if "num_training_steps" in inspect.signature(factory).parameters:
        kw["num_training_steps"] = total
    sched = factory(opt, num_warmup_steps=warmup, **kw)
    lrs = []
    for _ in range(total + 2):  # past the end too: the factor stays at 0, never negative
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs, sched.state_dict()


CASES = [(0, 1, {}), (0, 7, {}), (3, 10, {}), (10, 10, {}), (15, 150, {})]


@pytest.mark.parametrize("schedule,warmup,total,kw", [(s, *case) for s in sorted(OURS) for case in CASES]
                         + [("cosine", 2, 9, {"num_cycles": 1.5})])
def test_each_schedule_is_transformers_at_every_step(schedule, warmup, total, kw):
    ours, ours_state = _lrs(OURS[schedule], warmup, total, **kw)
    theirs, theirs_state = _lrs(_theirs(schedule), warmup, total, **kw)
    assert ours == theirs
    assert ours_state == theirs_state  # a checkpoint of either resumes the other


@pytest.mark.parametrize("schedule", sorted(OURS))
def test_the_signature_preflight_checks_is_transformers_own(schedule):
    assert inspect.signature(OURS[schedule]).parameters.keys() == inspect.signature(_theirs(schedule)).parameters.keys()


@pytest.mark.parametrize("schedule", list(Schedule))
def test_optimizer_schedule_picks_the_factory_and_its_kwargs_fit(schedule):
    cfg = OptimizerConfig(schedule=schedule, warmup_ratio=0.2)
    assert scheduler_factory(cfg) is OURS[schedule.value]
    inspect.signature(OURS[schedule.value]).bind(None, **scheduler_kwargs(cfg, 10))  # preflight's check, in short
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(cfg, opt, 10)
    lrs = []
    for _ in range(10):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == _lrs(_theirs(schedule.value), 2, 10, lr=1.0)[0][1:11]
