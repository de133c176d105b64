"""align's LR schedule is transformers' cosine-with-warmup, step for step and in its state dict, without
importing transformers' Trainer utilities (and through them peft and bitsandbytes)."""

from __future__ import annotations

import pytest
import torch

from align.optim import cosine_with_warmup


def _lrs(factory, warmup: int, total: int, **kw) -> tuple[list[float], dict]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    sched = factory(opt, num_warmup_steps=warmup, num_training_steps=total, **kw)
    lrs = []
    for _ in range(total + 2):  # past the end too: the factor stays at 0, never negative
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs, sched.state_dict()


@pytest.mark.parametrize("warmup,total,kw", [(0, 1, {}), (0, 7, {}), (3, 10, {}), (10, 10, {}), (15, 150, {}),
                                             (2, 9, {"num_cycles": 1.5})])
def test_the_schedule_is_transformers_cosine_with_warmup_at_every_step(warmup, total, kw):
    from transformers import get_cosine_schedule_with_warmup

    ours, ours_state = _lrs(cosine_with_warmup, warmup, total, **kw)
    theirs, theirs_state = _lrs(get_cosine_schedule_with_warmup, warmup, total, **kw)
    assert ours == theirs
    assert ours_state == theirs_state  # a checkpoint of either resumes the other


def test_the_signature_preflight_checks_is_transformers_own():
    import inspect

    from transformers import get_cosine_schedule_with_warmup

    assert inspect.signature(cosine_with_warmup).parameters.keys() == \
        inspect.signature(get_cosine_schedule_with_warmup).parameters.keys()
