"""Router telemetry: the formulas, that the counts are the model's own routing decisions (padding
excluded, recompute not double counted), that the statistics are computed in one batched pass per
forward (op count independent of the number of layers, equal to a per-layer reference), the reduce
over ranks, the applied router losses and the heatmap. Lives with the model tests because it runs on
transformers' routers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from align.config import Family, MoEConfig
from align.telemetry.moe import RouterTelemetry, lb_loss, router_metrics, z_loss
from tests.unit.models.conftest import MOE_FAMILIES, batch, perturb_


def test_metric_formulas_on_known_loads():
    E, k = 8, 2
    bal = router_metrics(np.full(E, 10.0), np.full(E, 40 / E), 40, 40 * np.log(E), 0.0, k)
    assert bal["max_vio"] == 0 and bal["utilization"] == pytest.approx(1) and bal["dead_frac"] == 0
    assert bal["entropy"] == pytest.approx(np.log(E)) and bal["lb_loss"] == pytest.approx(k)  # HF: balanced = top_k
    counts = np.array([41, 20, 10, 5, 3, 1, 0, 0], float)  # 80 slots, mean 10
    m = router_metrics(counts, np.full(E, 5.0), 40, 0.0, 12.0, k)
    assert m["max_vio"] == pytest.approx(3.1)
    assert m["utilization"] == pytest.approx(3 * 0.125 + (5 + 3 + 1) / 80)  # capped at 1/E per expert
    assert m["dead_frac"] == pytest.approx(2 / 8)  # only the two zeros are < 0.1 x 10 (1 is not)
    assert m["z_loss"] == pytest.approx(0.3)


def test_lb_and_z_values_equal_the_transformers_functions_with_padding_excluded():
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

    g = torch.Generator().manual_seed(0)
    B, S, E, k = 3, 7, 6, 2
    logits = torch.randn(B * S, E, generator=g) * 2
    mask = torch.ones(B, S, dtype=torch.long)
    mask[2, 4:] = 0
    keep = mask.reshape(-1).bool()
    ref_lb = float(load_balancing_loss_func((logits,), E, k, mask))
    ref_z = float(router_z_loss_func(logits[keep][None]))
    assert float(lb_loss(logits, E, k, mask)) == pytest.approx(ref_lb, rel=1e-6)
    assert float(z_loss(logits, keep)) == pytest.approx(ref_z, rel=1e-6)

    # ... and the window statistics of the telemetry give the same values
    class Router(torch.nn.Module):
        def forward(self, x):
            return x, None, torch.topk(torch.softmax(x, -1), k, -1).indices

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = Router()

        def forward(self, x, attention_mask=None):
            return self.router(x)

    from align.models.family_table import RouterTap

    model = Model().train()
    tel = RouterTelemetry(model, [RouterTap(0, model.router, lambda o: o[0], model.router, lambda o: o[2])], E, k)
    model(logits, attention_mask=mask)
    m = tel.on_step(1)
    assert m["moe/l0/lb_loss"] == pytest.approx(ref_lb, rel=1e-6)
    assert m["moe/l0/z_loss"] == pytest.approx(ref_z, rel=1e-6)


def _independent_topk(model, family, ids, mask):
    """Top-k ids per layer taken by a different route than the telemetry's hooks."""
    if family == Family.olmoe:  # transformers' own output_router_logits
        out = model(input_ids=ids, attention_mask=mask, use_cache=False, output_router_logits=True)
        k = model.config.num_experts_per_tok
        return {i: torch.topk(torch.softmax(lg.float(), -1), k, -1).indices for i, lg in enumerate(out.router_logits)}
    from align.models.roundtrip import capture_topk

    with capture_topk(model, family) as got:
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    return dict(got)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_counts_are_the_models_routing_with_padding_excluded(build, family, tokenizer):
    b = build(family, seed=1)
    perturb_(b.model)
    tel = b.runtime.moe
    ids, mask = batch(len(tokenizer), b=3, s=12, pad_last=5)
    b.model.train()
    with torch.no_grad():
        topk = _independent_topk(b.model, family, ids, mask)
    keep = mask.reshape(-1).bool()
    E = tel.E
    expected = np.stack([np.bincount(topk[layer][keep].reshape(-1).numpy(), minlength=E) for layer in tel.layers])
    tel.on_step(1)
    assert np.array_equal(tel.loads[-1], expected)
    assert tel.loads[-1].sum(-1).tolist() == [int(keep.sum()) * tel.k] * len(tel.layers)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_activation_checkpoint_recompute_and_eval_forwards_are_not_counted(build, family, tokenizer):
    b = build(family)
    b.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    b.model.train()
    ids, _ = batch(len(tokenizer), b=2, s=10)
    b.model(input_ids=ids, use_cache=False).logits.float().mean().backward()  # backward re-runs the routers
    b.model.eval()
    with torch.no_grad():
        b.model(input_ids=ids, use_cache=False)
    b.runtime.on_step(1)
    assert b.runtime.moe.loads[-1].sum(-1).tolist() == [20 * b.runtime.moe.k] * len(b.runtime.moe.layers)


def _grads(b, ids, mask, aux: bool):
    b.model.zero_grad(set_to_none=True)
    out = b.model(input_ids=ids, attention_mask=mask, use_cache=False)
    loss = out.logits.float().logsumexp(-1).mean()
    if aux:
        loss = loss + b.runtime.aux_loss(scale=0.5)
    loss.backward()
    return {n: p.grad.clone() for n, p in b.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("which", ["lb_weight", "z_weight"])
def test_nonzero_router_loss_weight_changes_gradients_and_zero_does_not(build, family, which, tokenizer):
    ids, mask = batch(len(tokenizer), pad_last=3)
    plain = build(family, seed=2)
    perturb_(plain.model)
    ref = _grads(plain, ids, mask, aux=False)
    zero = build(family, seed=2)
    perturb_(zero.model)
    assert zero.runtime.aux_loss() == 0.0
    got0 = _grads(zero, ids, mask, aux=True)
    assert all(torch.equal(ref[n], got0[n]) for n in ref)
    on = build(family, seed=2, moe=MoEConfig(**{which: 0.5}))
    perturb_(on.model)
    got = _grads(on, ids, mask, aux=True)
    router = [n for n in ref if "router" in n or ".gate." in n]
    assert router and any(not torch.equal(ref[n], got[n]) for n in router)
    assert on.info["moe"][f"{which}_applied"] == 0.5 and zero.info["moe"][f"{which}_applied"] == 0.0


def test_heatmap_png_and_raw_loads_are_written(build, tokenizer, tmp_path):
    b = build(Family.olmoe)
    b.model.train()
    for step in (1, 2, 3):
        ids, _ = batch(len(tokenizer), seed=step)
        b.model(input_ids=ids, use_cache=False)
        b.runtime.on_step(step)
    out = b.runtime.finish(tmp_path)
    png = tmp_path / "plots" / "moe_expert_load.png"
    assert out["moe_heatmap"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    raw = np.load(png.with_suffix(".npz"))
    assert raw["loads"].shape == (3, 2, 8) and raw["steps"].tolist() == [1, 2, 3]
    assert np.array_equal(raw["loads"][1], b.runtime.moe.loads[1])


def test_wandb_logger_keeps_the_moe_namespace():
    from align.telemetry.wandb_logger import WandbLogger

    class Run:
        logged = None

        def log(self, d):
            self.logged = d

    lg = WandbLogger.__new__(WandbLogger)
    lg.run = Run()
    lg.log({"loss": 1.0, "moe/l3/max_vio": 2.0}, step=7)
    assert lg.run.logged == {"train/step": 7, "train/loss": 1.0, "moe/l3/max_vio": 2.0}


# ------------------------------------------------------------------------- reduce over ranks

def _rank(rank: int, world: int, port: int, q) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from align.models.family_table import RouterTap

    class Router(torch.nn.Module):
        def forward(self, x):
            return x, None, torch.topk(x, 2, -1).indices

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = Router()

        def forward(self, x):
            return self.router(x)

    model = Model().train()
    tel = RouterTelemetry(model, [RouterTap(5, model.router, lambda o: o[0], model.router, lambda o: o[2])], 4, 2)
    x = torch.full((6, 4), -1.0)
    x[:, rank] = 1.0  # rank r routes every token to experts r and the next highest (ties -> lowest id)
    x[:, 3] = 0.5
    model(x)
    q.put((rank, tel.on_step(1), tel.loads[-1].tolist()))
    torch.distributed.destroy_process_group()


def test_window_statistics_are_summed_over_ranks():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (_, m0, l0), (_, m1, l1) = got
    assert l0 == l1 == [[6.0, 6.0, 0.0, 12.0]]  # rank 0: experts {0,3}, rank 1: {1,3}
    assert m0 == m1 and m0["moe/l5/max_vio"] == pytest.approx(1.0) and m0["moe/l5/dead_frac"] == 0.25


# ----------------------------------------------------------------- one batched pass per forward

def per_layer_reference(logits: torch.Tensor, ids: torch.Tensor, mask, E: int) -> torch.Tensor:
    """Window rows [L, 2E+3] computed one layer at a time, by another route where it can: counts by
    bincount of the kept ids (boolean indexing), sums over the kept tokens in fp64 of the same fp32
    per-token values (exp(log_softmax), entropy, logsumexp^2) the product sums."""
    L, T = logits.shape[:2]
    keep = torch.ones(T, dtype=torch.bool, device=logits.device) if mask is None else mask
    rows = []
    for layer in range(L):
        lg = logits[layer].float()
        logp = torch.log_softmax(lg, -1)
        p = logp.exp()
        rows.append(torch.cat([
            torch.bincount(ids[layer][keep].reshape(-1), minlength=E).double(),
            p[keep].double().sum(0),
            keep.sum().double()[None],
            (-(p * logp).sum(-1))[keep].double().sum()[None],
            torch.logsumexp(lg, -1).square()[keep].double().sum()[None],
        ]))
    return torch.stack(rows)


def _random_routing(L, T, E, k, dtype, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(L, T, E, generator=g) * 3).to(dtype)
    ids = torch.randint(0, E, (L, T, k), generator=g)
    mask = torch.rand(T, generator=g) > 0.3 if masked else None
    return logits, ids, mask


def _assert_rows_equal(got: torch.Tensor, ref: torch.Tensor, E: int) -> None:
    assert got.dtype == torch.float64 and got.shape == ref.shape
    assert torch.equal(got[:, :E], ref[:, :E])  # counts: exact
    assert ((got - ref).abs() <= 1e-12 * ref.abs().clamp_min(1)).all(), (got - ref).abs().max()


@pytest.mark.parametrize("L,E,k,T,dtype,masked", [
    (4, 8, 2, 50, torch.float32, False),
    (4, 8, 2, 50, torch.float32, True),
    (4, 8, 2, 50, torch.bfloat16, True),
    (33, 128, 4, 24, torch.float32, True),  # 33 x 129 = 4257 histc bins: float histc misbins bin edges there
])
def test_batched_window_rows_equal_the_per_layer_reference(L, E, k, T, dtype, masked):
    from align.telemetry.moe import window_stats

    logits, ids, mask = _random_routing(L, T, E, k, dtype, masked)
    _assert_rows_equal(window_stats(logits, ids, mask, E), per_layer_reference(logits, ids, mask, E), E)


class _Router(torch.nn.Module):
    """Returns (logits, scores, top-k ids) like OlmoeTopKRouter; its input IS the logits."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x):
        return x, None, torch.topk(x, self.k, -1).indices


class _Routers(torch.nn.Module):
    """Routers under `layers.<i>`; layer i routes xs[i], so a test picks every layer's logits and
    token count. `raise_after=i` raises after layer i (a forward that fails half way)."""

    def __init__(self, L: int, k: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Router(k) for _ in range(L))

    def forward(self, xs, attention_mask=None, raise_after=None):
        for i, x in enumerate(xs):
            self.layers[i](x)
            if raise_after == i:
                raise RuntimeError("forward failed")
        return xs


def _toy(L: int, E: int, k: int, record: bool = True):
    from align.models.family_table import RouterTap

    model = _Routers(L, k).train()
    taps = [RouterTap(i, r, lambda o: o[0], r, lambda o: o[2]) for i, r in enumerate(model.layers)]
    return model, RouterTelemetry(model, taps, E, k, record=record)


def _metrics_of(rows: np.ndarray, E: int, k: int) -> list[dict[str, float]]:
    return [router_metrics(r[:E], r[E:2 * E], *r[2 * E:], top_k=k) for r in rows]


@pytest.mark.parametrize("shapes", ["same", "mixed"])
def test_telemetry_window_equals_the_per_layer_reference_over_two_forwards(shapes):
    """Through the hooks: uniform layers take the one-group path; layers that saw different token
    counts fall back to groups of equal shape (rows 0,2 and 1,3), each layer in its own row."""
    L, E, k, B, S = 4, 8, 2, 3, 6
    model, tel = _toy(L, E, k)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[-1, 2:] = 0
    ref = torch.zeros(L, 2 * E + 3, dtype=torch.float64)
    for seed in (0, 1):  # two micro-batches of one window
        g = torch.Generator().manual_seed(seed)
        xs = [torch.randn(B * S if shapes == "same" or i % 2 == 0 else S, E, generator=g) * 2 for i in range(L)]
        model(xs, attention_mask=mask)
        for i, x in enumerate(xs):
            m = mask.reshape(-1).bool() if x.shape[0] == B * S else None  # no mask fits the short layers
            ref[i] += per_layer_reference(x[None], torch.topk(x, k, -1).indices[None], m, E)[0]
    out = tel.on_step(1)
    assert np.array_equal(tel.loads[-1], ref[:, :E].numpy())
    for layer, want in enumerate(_metrics_of(ref.numpy(), E, k)):
        for key, v in want.items():
            assert out[f"moe/l{layer}/{key}"] == pytest.approx(v, rel=1e-12, abs=1e-12), (layer, key)


def _ops_per_forward(model, tel, record: bool, **inputs) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    tel.record = record
    with Count(), torch.no_grad():
        model(**inputs)
    return Count.n


def test_telemetry_op_count_per_forward_does_not_grow_with_the_number_of_moe_layers(build, tokenizer):
    """The aten ops the telemetry issues in one forward (record on minus record off, same model and
    batch, padding mask given) are the same for 2 and 4 MoE layers: one batched pass, not a pass
    per layer. An eval forward issues none."""
    ids, mask = batch(len(tokenizer), b=2, s=12, pad_last=4)
    got = {}
    for n in (2, 4):
        b = build(Family.olmoe, overrides={"num_hidden_layers": n})
        b.model.train()
        tel = b.runtime.moe
        assert len(tel.layers) == n
        inputs = dict(input_ids=ids, attention_mask=mask, use_cache=False)
        got[n] = _ops_per_forward(b.model, tel, True, **inputs) - _ops_per_forward(b.model, tel, False, **inputs)
        b.model.eval()
        assert _ops_per_forward(b.model, tel, True, **inputs) == _ops_per_forward(b.model, tel, False, **inputs)
    assert got[2] > 0 and got[2] == got[4], got


def test_a_forward_that_raises_accumulates_nothing_and_one_without_routers_does_nothing():
    L, E, k = 3, 6, 2
    model, tel = _toy(L, E, k)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(10, E, generator=g) for _ in range(L)]
    with pytest.raises(RuntimeError, match="forward failed"):
        model([torch.randn(10, E, generator=g) for _ in range(L)], raise_after=1)
    assert not getattr(tel, "_stash", []) and tel._window is None  # nothing of it is kept or counted
    model([])  # a train-mode forward in which no router runs
    assert tel._window is None
    model(xs)
    tel.on_step(1)
    ref = per_layer_reference(torch.stack(xs), torch.stack([torch.topk(x, k, -1).indices for x in xs]), None, E)
    assert np.array_equal(tel.loads[-1], ref[:, :E].numpy())  # the good forward only


def _left_on_routers(model) -> list[str]:
    from align.telemetry.moe import _IDS, _LOGITS

    return [f"{n}.{a}" for n, m in model.named_modules() for a in (_LOGITS, _IDS) if a in m.__dict__]


def test_no_forward_leaves_its_logits_on_the_routers(monkeypatch):
    """What the router hooks leave is dropped after every forward: one that returns, one that raises
    half way and one whose telemetry pass raises (the always_call hook still runs after it). Left
    there, a step's logits would stay alive until the next forward."""
    L, E, k = 3, 6, 2
    model, tel = _toy(L, E, k)
    g = torch.Generator().manual_seed(0)
    model([torch.randn(10, E, generator=g) for _ in range(L)])
    assert tel._window is not None and _left_on_routers(model) == []
    with pytest.raises(RuntimeError, match="forward failed"):
        model([torch.randn(10, E, generator=g) for _ in range(L)], raise_after=1)
    assert _left_on_routers(model) == []

    def fail(seen):
        raise RuntimeError("telemetry failed")
    monkeypatch.setattr(tel, "_accumulate", fail)
    with pytest.raises(RuntimeError, match="telemetry failed"):
        model([torch.randn(10, E, generator=g) for _ in range(L)])
    assert _left_on_routers(model) == [] and not tel._armed


def test_a_window_read_started_at_the_boundary_gives_the_same_metrics_and_the_trainer_starts_it_before_the_step(
        tmp_path):
    """close_window() starts the host copy before the optimizer step is queued (on a GPU a later
    .cpu() would wait for the step); on_step must then report exactly what it reports without it."""
    from tests.conftest import build_trainer

    trainer = build_trainer(tmp_path, "model=olmoe", "model.preset=tiny", "trainer.max_steps=1")
    tel = trainer.runtime.moe
    batches = iter(trainer.stream)
    b = next(batches)
    trainer.model(**b.model_inputs())
    window = tel._window.clone()
    direct = tel.on_step(1)
    tel._window = window.clone()
    tel.close_window()
    tel._window.add_(1.0)  # later device work on the window must not reach this step's numbers
    assert tel.on_step(1) == direct

    order = []
    trainer.runtime.close_window = lambda: order.append("close")
    real_step = trainer.stepper.step
    trainer.stepper.step = lambda: (order.append("step"), real_step())
    trainer.train_step(batches)
    assert order == ["close", "step"]
