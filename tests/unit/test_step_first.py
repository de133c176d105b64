"""The step-first boundary (one process, fused AdamW): the clip scale and the non-finite skip are
decided on the device inside the optimizer's kernel, so the step is queued before the host reads the
loss and the norm. It must clip like clip_grad_norm_, skip exactly what the host's verdict skips,
and leave a skipped step's parameters, moments and step counts untouched."""

from __future__ import annotations

import json

import pytest
import torch

from align.parallel.grad import arm_fused_step, clip_grad_norm_


def params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(48, 16)), torch.nn.Parameter(torch.randn(7))]


def grads(scale, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(48, 16, generator=g) * scale, torch.randn(7, generator=g) * scale]


def snapshot(ps, opt):
    return [p.detach().clone() for p in ps], [{k: v.clone() for k, v in opt.state[p].items()} for p in ps]


@pytest.mark.parametrize("max_norm", [1.0, 0.0])
def test_step_first_clips_as_the_host_path_does_and_reports_the_same_norm(max_norm):
    a, b = params(), params()
    oa = torch.optim.AdamW(a, lr=0.1, eps=1.0, fused=True)  # eps 1: the update depends on the scale
    ob = torch.optim.AdamW(b, lr=0.1, eps=1.0, fused=True)
    for step, size in enumerate((5.0, 1e-3, 3.0)):  # clipped, not clipped (the scale must not linger), clipped
        for p, q, g in zip(a, b, grads(size, step)):
            p.grad, q.grad = g.clone(), g.clone()
        host_norm = clip_grad_norm_(a, max_norm, oa)
        oa.step()
        loss, norm = arm_fused_step(ob, b, torch.tensor(2.0), max_norm).tolist()
        ob.step()
        assert loss == 2.0 and norm == pytest.approx(host_norm, rel=1e-12)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert float((a[0].detach() - params()[0].detach()).abs().max()) > 1e-2  # the steps moved the parameters


@pytest.mark.parametrize("bad", ["loss", "grad"])
def test_a_non_finite_step_is_skipped_by_the_device_and_the_next_one_applies(bad):
    ps = params()
    opt = torch.optim.AdamW(ps, lr=0.1, fused=True)
    for p, g in zip(ps, grads(1.0, 0)):
        p.grad = g
    arm_fused_step(opt, ps, torch.tensor(1.0), 1.0)
    opt.step()
    before = snapshot(ps, opt)
    g = grads(1.0, 1)
    if bad == "grad":
        g[1][3] = float("nan")
    for p, x in zip(ps, g):
        p.grad = x
    loss = torch.tensor(float("nan") if bad == "loss" else 1.0)
    _, norm = arm_fused_step(opt, ps, loss, 1.0).tolist()
    opt.step()
    after = snapshot(ps, opt)
    for x, y in zip(before[0], after[0]):
        assert torch.equal(x, y)
    for sx, sy in zip(before[1], after[1]):
        assert all(torch.equal(sx[k], sy[k]) for k in sx)  # moments and the step count too
    for p, x in zip(ps, grads(1.0, 2)):
        p.grad = x
    arm_fused_step(opt, ps, torch.tensor(1.0), 1.0)
    opt.step()
    assert not torch.equal(after[0][0], ps[0]) and float(opt.state[ps[0]]["step"]) == 2.0


def test_a_cpu_run_with_a_fused_optimizer_takes_the_step_first_path_and_skips_an_injected_nan(tmp_path, monkeypatch):
    import align.optim as optim
    from tests.conftest import build_trainer

    real = optim.optimizer_kwargs
    monkeypatch.setattr(optim, "optimizer_kwargs", lambda cfg, dev: {**real(cfg, dev), "fused": True})
    monkeypatch.setenv("ALIGN_TEST_INJECT_NAN", "0:3")
    trainer = build_trainer(tmp_path, "trainer.max_steps=4", "optimizer.warmup_ratio=0")
    assert trainer.step_first and trainer.model_info["clip_and_skip"].startswith("device")
    seen = {}
    step = trainer.train_step

    def spy(batches):  # parameters around the step the NaN hits
        seen[trainer.state.step + 1] = [p.detach().clone() for p in trainer.model.parameters()]
        return step(batches)
    trainer.train_step = spy
    assert trainer.fit() == 0
    rows = [json.loads(x) for x in (trainer.run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in rows] == [False, False, True, False]
    assert all(torch.equal(x, y) for x, y in zip(seen[3], seen[4]))  # step 3 changed nothing
    assert not all(torch.equal(x, y) for x, y in zip(seen[2], seen[3]))  # step 2 did change something
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    p0 = next(iter(trainer.model.parameters()))
    assert float(trainer.optimizer.state[p0]["step"]) == 3  # three applied steps, each applied once


def test_step_first_can_be_turned_off_and_the_manifest_says_which(tmp_path, monkeypatch):
    import align.optim as optim
    from tests.conftest import build_trainer

    real = optim.optimizer_kwargs
    monkeypatch.setattr(optim, "optimizer_kwargs", lambda cfg, dev: {**real(cfg, dev), "fused": True})
    off = build_trainer(tmp_path / "off", "optimizer.step_first=false")
    assert not off.step_first and off.model_info["clip_and_skip"].startswith("host")
    monkeypatch.setattr(optim, "optimizer_kwargs", real)  # not fused (the CPU default): the host decides
    plain = build_trainer(tmp_path / "plain")
    assert not plain.step_first and plain.model_info["clip_and_skip"].startswith("host")
