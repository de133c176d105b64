"""optimizer.overlap and optimizer.compile (align.optim.step): chunk-wise steps are bit-identical to
one step, the next forward waits for each block's chunk only when it reaches that block, gradients
are kept for the side stream, the compiled update (alone or per chunk) keeps its graphs under a
schedule, and the options resolve (or are refused) honestly."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch._dynamo

from align.config import OptimizerConfig, to_typed
from align.errors import ConfigError
from align.optim.step import CompiledStep, OverlappedStep, build_stepper, param_chunks, step_subset
from align.parallel.fsdp import decoder_blocks
from tests.conftest import build_tiny


def adamw(model, weight_decay=0.1):
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1.0, fused=True)


def set_grads(model, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_chunks_cover_every_parameter_once_in_forward_order():
    model = build_tiny().model
    blocks = decoder_blocks(model)
    chunks = param_chunks(model, blocks, list(model.parameters()))
    assert len(chunks) == len(blocks) + 1
    flat = [id(p) for c in chunks for p in c]
    assert sorted(flat) == sorted(id(p) for p in model.parameters()) and len(set(flat)) == len(flat)
    for i, block in enumerate(blocks):
        assert {id(p) for p in chunks[i + 1]} == {id(p) for p in block.parameters()}
    assert {id(p) for p in chunks[0]} >= {id(model.get_input_embeddings().weight), id(model.lm_head.weight)}


def test_chunk_wise_steps_are_bit_identical_to_one_step_with_the_clip_scale_and_a_changing_lr():
    a, b = build_tiny().model, build_tiny().model
    oa, ob = adamw(a), adamw(b)
    chunks = param_chunks(b, decoder_blocks(b), list(b.parameters()))
    for step in range(3):
        set_grads(a, step)
        set_grads(b, step)
        for o in (oa, ob):  # the folded clip (align.parallel.grad) and a schedule both in play
            o.grad_scale = torch.tensor(1.7 + step)
            for g in o.param_groups:
                g["lr"] = 1e-2 / (step + 1)
        oa.step()
        for c in reversed(chunks):  # any order: each update is elementwise per parameter
            step_subset(ob, {id(p) for p in c})
        assert len(ob.param_groups) == 2 and sum(len(g["params"]) for g in ob.param_groups) == len(list(b.parameters()))
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n
        sa, sb = oa.state[pa], ob.state[pb]
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"]) and torch.equal(sa["step"], sb["step"]), n
    assert oa.state_dict()["param_groups"] == ob.state_dict()["param_groups"]  # a checkpoint cannot tell


class FakeStreams:
    """Logs what OverlappedStep asks of the streams, in order. `compiled`: log the launches of that
    CompiledStep's compiled updates (outside dynamo's trace) instead of the optimizer's step."""

    def __init__(self, optimizer, compiled=None):
        self.log: list[tuple] = []
        self.side = False

        def logged(step):
            def logged_step(*a, **k):  # which parameters each launch covers, and on which stream
                params = frozenset(id(p) for g in optimizer.param_groups for p in g["params"])
                self.log.append(("step", params, self.side))
                return step(*a, **k)
            return logged_step
        if compiled is None:
            optimizer.step = logged(optimizer.step)
        else:
            compiled._plain, compiled._scaled = logged(compiled._plain), logged(compiled._scaled)

    def side_waits_for_main(self):
        self.log.append(("side_waits_for_main",))

    @contextlib.contextmanager
    def on_side(self):
        self.side = True
        try:
            yield
        finally:
            self.side = False

    def keep_for_side(self, t):
        self.log.append(("keep", id(t)))

    def record(self):
        self.log.append(("record", len(self.log)))
        return self.log[-1][1]

    def main_waits(self, event):
        self.log.append(("wait", event))


def capturable_adamw(model):
    """What optimizer.compile builds (foreach, capturable), with adamw()'s groups and eps."""
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in adamw(model).param_groups]
    return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1.0, foreach=True, capturable=True)


def overlapped(model, compiled: bool):
    """An OverlappedStep on fake streams: its chunks step through the optimizer's fused kernels, or
    through a CompiledStep under dynamo's eager backend (guards and recompiles, no code generation)."""
    if not compiled:
        opt = adamw(model)
        streams = FakeStreams(opt)
        return OverlappedStep(opt, model, decoder_blocks(model), streams), streams
    opt = capturable_adamw(model)
    comp = CompiledStep(opt, torch.device("cpu"), backend="eager")
    streams = FakeStreams(opt, comp)
    return OverlappedStep(opt, model, decoder_blocks(model), streams, comp), streams


@pytest.mark.parametrize("compiled", [False, True], ids=["fused", "compiled"])
def test_the_next_forward_waits_for_each_blocks_chunk_only_when_it_reaches_that_block(compiled):
    torch._dynamo.reset()
    model = build_tiny().model
    blocks = decoder_blocks(model)
    stepper, streams = overlapped(model, compiled)
    opt = stepper.optimizer
    opt.grad_scale = torch.tensor(2.0)  # a clipped step: the scale crosses streams too
    for i, block in enumerate(blocks):  # registered after the stepper's waits: runs after them
        block.register_forward_pre_hook(lambda m, a, i=i: streams.log.append(("forward", i)))
    x = torch.randint(0, 64, (2, 8))

    model(input_ids=x).logits.sum().backward()
    scale = opt.grad_scale
    stepper.step()
    grads = {id(p.grad) for p in model.parameters()}
    model(input_ids=x)
    log = streams.log

    first_step = next(i for i, e in enumerate(log) if e[0] == "step")
    assert ("side_waits_for_main",) in log[:first_step]
    kept = {e[1] for e in log[:first_step] if e[0] == "keep"}
    assert kept == grads | {id(scale)}  # every gradient and the clip scale kept for the side stream
    steps = [e for e in log if e[0] == "step"]
    assert all(on_side for _, _, on_side in steps)
    assert [set(s[1]) for s in steps] == [{id(p) for p in c} for c in stepper.chunks]
    records = [e[1] for e in log if e[0] == "record"]
    assert len(records) == len(stepper.chunks)
    waits = [i for i, e in enumerate(log) if e[0] == "wait"]
    forwards = {e[1]: i for i, e in enumerate(log) if e[0] == "forward"}
    assert [log[i][1] for i in waits] == records  # each chunk waited for once, in forward order
    assert waits[0] < forwards[0]  # embeddings and head before anything runs
    for b in range(len(blocks)):
        assert waits[b + 1] < forwards[b]  # block b's parameters are stepped before block b runs ...
        if b:
            assert waits[b + 1] > forwards[b - 1]  # ... and the wait is no earlier than needed

    n = len(log)
    model(input_ids=x)  # a second forward (next micro-batch) waits for nothing more
    assert not [e for e in log[n:] if e[0] == "wait"]


def stepped_once():
    """An OverlappedStep on fake streams that has queued one step (no forward since)."""
    model = build_tiny().model
    opt = adamw(model)
    streams = FakeStreams(opt)
    stepper = OverlappedStep(opt, model, decoder_blocks(model), streams)
    set_grads(model, 0)
    stepper.step()
    return model, stepper, streams


def test_sync_orders_every_queued_chunk_before_a_checkpoint_reads_parameters():
    _, stepper, streams = stepped_once()
    stepper.sync()
    assert [e[1] for e in streams.log if e[0] == "wait"] == [e[1] for e in streams.log if e[0] == "record"]


def test_overlap_and_compile_resolve_off_on_a_cpu_and_say_why():
    model = build_tiny().model
    cpu = torch.device("cpu")
    s = build_stepper(OptimizerConfig(overlap=True, compile=False), adamw(model), model, cpu)
    assert s.info() == {"kind": "plain", "overlap": False, "compiled": False,
                        "reason": "optimizer.overlap: device cpu: side streams are a CUDA feature"}
    s = build_stepper(OptimizerConfig(compile=True), adamw(model), model, cpu)
    assert s.info()["kind"] == "plain" and s.info()["reason"].startswith("optimizer.compile: device cpu")
    s = build_stepper(OptimizerConfig(compile=True, overlap=True), adamw(model), model, cpu)
    assert s.info()["kind"] == "plain" and s.info()["reason"] == (
        "optimizer.compile: device cpu: the compiled step is capturable, a CUDA feature; "
        "optimizer.overlap: device cpu: side streams are a CUDA feature")
    assert build_stepper(OptimizerConfig(compile=False), adamw(model), model, cpu).info()["reason"] == \
        "optimizer.overlap=false, optimizer.compile=false"


def test_an_unresolved_auto_never_reaches_the_stepper():
    """optimizer.compile=auto is the trainer's to resolve (align.parallel.compile): "auto" is truthy, and
    read as is it would build a compiled step over a fused optimizer."""
    model = build_tiny().model
    with pytest.raises(ValueError, match="unresolved"):
        build_stepper(OptimizerConfig(), adamw(model), model, torch.device("cpu"))


@pytest.mark.parametrize("option, bad, accepted", [
    ("optimizer.overlap=true", ["parallel=fsdp"], "parallel=single"),
    ("optimizer.overlap=true", ["trainer.compile=true"], "trainer.compile=false"),
    ("optimizer.compile=true", ["optimizer=adamw8bit"], "optimizer=adamw"),
])
def test_overlap_and_compile_are_refused_where_they_cannot_hold(compose, option, bad, accepted):
    with pytest.raises(ConfigError) as e:
        to_typed(compose([option, *bad]))
    assert option.split("=")[0] in str(e.value) and accepted in str(e.value)
    to_typed(compose(bad))  # the same config without the option is fine


@pytest.mark.parametrize("options", [["optimizer.overlap=true"], ["optimizer.overlap=true", "optimizer.compile=true"]],
                         ids=["overlap", "overlap+compile"])
def test_a_cpu_run_records_overlap_resolved_off_in_the_manifest(tmp_path, options):
    from tests.conftest import build_trainer

    trainer = build_trainer(tmp_path, *options, "trainer.max_steps=2")
    assert trainer.model_info["optimizer_step"]["kind"] == "plain"
    assert "side streams are a CUDA feature" in trainer.model_info["optimizer_step"]["reason"]
    assert ("the compiled step is capturable" in trainer.model_info["optimizer_step"]["reason"]) == (len(options) == 2)
    assert trainer.fit() == 0


def test_a_step_first_orders_any_chunk_the_last_forward_never_waited_for():
    model, stepper, streams = stepped_once()
    first = [e[1] for e in streams.log if e[0] == "record"]
    n = len(streams.log)
    set_grads(model, 1)
    stepper.step()  # no forward in between (e.g. a block the forward skipped): the main stream must still wait
    second = streams.log[n:]
    assert [e[1] for e in second[:second.index(("side_waits_for_main",))] if e[0] == "wait"] == first


def test_the_trainer_syncs_the_side_stream_before_a_checkpoint_or_an_export_reads_parameters(tmp_path, monkeypatch):
    import align.callbacks.checkpointing as ckpt
    import align.trainer as tr
    from tests.conftest import build_trainer

    trainer = build_trainer(tmp_path, "trainer.max_steps=1", "trainer.export=true", "trainer.save_every=1")
    synced = []
    trainer.stepper.sync = lambda: synced.append(True)
    seen = []
    for module, name in ((ckpt, "save_checkpoint"), (tr, "export_model")):  # where each is called from
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, real=real, name=name, **k: (seen.append((name, len(synced))), real(*a, **k))[1])
    assert trainer.fit() == 0
    assert [n for n, _ in seen] == ["save_checkpoint", "export_model"]
    assert all(count >= 1 for _, count in seen) and seen[1][1] > seen[0][1]  # a sync before each read


def test_the_trainer_takes_the_gradient_norm_through_the_steppers_norms(tmp_path):
    """optimizer.compile hands the clip a compiled norm; the loop must use the stepper's, whichever it is."""
    from align.parallel.grad import foreach_norms
    from tests.conftest import build_trainer

    trainer = build_trainer(tmp_path, "trainer.max_steps=1")
    calls = []
    trainer.stepper.norms_of = lambda grads: (calls.append(len(grads)), foreach_norms(grads))[1]
    trainer.train_step(iter(trainer.stream))
    assert calls == [sum(1 for p in trainer.model.parameters() if p.requires_grad)]


def test_the_compiled_step_equals_clip_then_step_and_a_changing_lr_recompiles_nothing():
    """CompiledStep on CPU with dynamo's eager backend (guards and recompiles, no code generation):
    the lr handed in as a persistent tensor keeps one graph per variant under a schedule, and the
    clip scale divided inside the graph equals an explicit clip before an uncompiled step."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    a, b = build_tiny().model, build_tiny().model
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1.0, weight_decay=0.1, foreach=True)
    # the reference runs uncompiled, where torch allows capturable only on accelerators
    oa, ob = torch.optim.AdamW(a.parameters(), **kw), torch.optim.AdamW(b.parameters(), capturable=True, **kw)
    comp = CompiledStep(ob, torch.device("cpu"), backend="eager")
    graphs = []
    for step in range(6):
        set_grads(a, step)
        set_grads(b, step)
        lr = 1e-2 / (step + 1)  # a schedule: a new value every step
        oa.param_groups[0]["lr"] = ob.param_groups[0]["lr"] = lr
        scale = 2.0 + step if step % 2 else None  # clipped and unclipped steps: both graphs
        if scale is not None:
            torch._foreach_div_([p.grad for p in a.parameters()], scale)
            ob.grad_scale = torch.tensor(scale)
        oa.step()
        comp.step()
        # floats back, scale used
        assert type(ob.param_groups[0]["lr"]) is float and getattr(ob, "grad_scale", None) is None
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[1] and graphs[1] >= 2, graphs  # one graph per variant, nothing after
    for (n, p), q in zip(a.named_parameters(), b.parameters()):  # capturable computes bias corrections as tensors
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=n)
    assert float((next(b.parameters()) - build_tiny().model.model.embed_tokens.weight).abs().max()) > 1e-3  # it trained


def test_the_overlapped_compiled_step_is_bit_identical_to_clip_then_one_compiled_step():
    """Both options on: each chunk's compiled update (its view of the groups, the tensor lrs, the clip
    scale divided out of its own gradients only) equals dividing every gradient by the scale and then
    one compiled step over all parameters, bit for bit, under a schedule, clipped or not."""
    torch._dynamo.reset()
    a, b = build_tiny().model, build_tiny().model
    oa = capturable_adamw(a)
    whole = CompiledStep(oa, torch.device("cpu"), backend="eager")
    stepper, streams = overlapped(b, compiled=True)
    ob = stepper.optimizer
    groups = ob.param_groups
    for step in range(5):
        set_grads(a, step)
        set_grads(b, step)
        lr = 1e-2 / (step + 1)
        for o in (oa, ob):
            for g in o.param_groups:
                g["lr"] = lr
        scale = 2.0 + step if step % 2 else None  # eps=1: a skipped or doubled division shows
        if scale is not None:
            torch._foreach_div_([p.grad for p in a.parameters()], scale)  # the clip, then the step
            ob.grad_scale = torch.tensor(scale)
        whole.step()
        stepper.step()
        assert ob.param_groups is groups and all(type(g["lr"]) is float and g["lr"] == lr for g in groups)
        assert getattr(ob, "grad_scale", None) is None  # used once, not again next step
    assert len([e for e in streams.log if e[0] == "step"]) == 5 * len(stepper.chunks)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n
        sa, sb = oa.state[pa], ob.state[pb]
        assert all(torch.equal(sa[k], sb[k]) for k in ("exp_avg", "exp_avg_sq", "step")), n
    assert float((next(b.parameters()) - build_tiny().model.model.embed_tokens.weight).abs().max()) > 1e-3  # it trained
    assert stepper.norms_of is stepper.compiled.norms_of  # the clip takes the compiled fp64 norm


def test_the_overlapped_compiled_step_keeps_every_chunks_graphs_and_a_changing_lr_recompiles_nothing():
    """Each chunk is another list of parameters, so another dynamo cache entry on torch's `Adam.step`
    code: past `recompile_limit` a chunk would silently step eagerly. The stepper raises the limit to
    two entries per chunk (OLMoE's 17 chunks need 34 > the default 8; here 4 chunks from a limit of 3)
    and records it; then every chunk is compiled, and a schedule adds no graph."""
    # not monkeypatch: its undo deletes the config entry, which torch then hides for the whole process
    with torch._dynamo.config.patch(recompile_limit=3):
        _every_chunk_compiled()


def _every_chunk_compiled():
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = build_tiny(overrides={"num_hidden_layers": 3}).model  # four chunks: more than the limit of 3
    stepper, streams = overlapped(model, compiled=True)
    n = len(stepper.chunks)
    assert n == 4 and torch._dynamo.config.recompile_limit == 2 * n
    assert stepper.info() == {"kind": "overlap+compiled", "overlap": True, "compiled": True, "chunks": n,
                              "params_per_chunk": [len(c) for c in stepper.chunks], "recompile_limit": 2 * n}
    graphs = []
    before = counters["stats"]["unique_graphs"]  # the counters live as long as the process
    for step in range(6):
        set_grads(model, step)
        for g in stepper.optimizer.param_groups:
            g["lr"] = 1e-2 / (step + 1)
        if step % 2:
            stepper.optimizer.grad_scale = torch.tensor(2.0 + step)
        stepper.step()
        graphs.append(counters["stats"]["unique_graphs"] - before)
    # step 0: one update graph per chunk, traced while the optimizer state is being created; step 1
    # (clipped): the division per chunk, and the update again for every chunk but the last (whose
    # first trace already saw the whole state); then nothing more, whatever the lr
    assert graphs == [n] + [3 * n - 1] * 5, graphs
    update_code = torch.optim.Adam.step.__wrapped__.__code__
    assert len(_debug_get_cache_entry_list(update_code)) == 2 * n - 1 <= torch._dynamo.config.recompile_limit


def test_a_torch_without_recompile_limit_is_refused_in_one_line():
    from types import SimpleNamespace

    model = build_tiny().model
    comp = CompiledStep(capturable_adamw(model), torch.device("cpu"), backend="eager")
    with pytest.raises(ConfigError) as e:
        comp.allow_param_lists(17, SimpleNamespace(cache_size_limit=8))
    assert "optimizer.compile" in str(e.value) and "recompile_limit" in str(e.value)
    limits = SimpleNamespace(recompile_limit=64, accumulated_recompile_limit=256)
    assert comp.allow_param_lists(17, limits) == 64 and limits.recompile_limit == 64  # never lowered
