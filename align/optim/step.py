"""How the optimizer steps at a boundary: as is (`PlainStep`), compiled (`CompiledStep`,
`optimizer.compile`) or overlapped with the next forward (`OverlappedStep`, `optimizer.overlap`),
whose chunks step through either the optimizer's own kernels or the compiled update (both options).

`optimizer.overlap`: run step t's optimizer on a side CUDA stream, one decoder block at a time in
forward order, while step t+1's forward waits for each block's parameters only when it reaches that
block.

Why: on one GPU the optimizer is a bandwidth-bound pass over every parameter, serial with the
compute, while the next forward's GEMMs leave the memory system mostly idle. For a MoE model with
billions of parameters the update is a visible share of the step
(docs/benchmarks/log.md#e-2026-11-30-moe-optimizer).

Exactness: the same optimizer object steps each parameter once per step, with the same gradients,
hyperparameters and clip scale, through its own kernels; only the order of launches over parameter
subsets changes, and every update is elementwise. The result is bit-identical to one
`optimizer.step()` (tests/unit/optim/test_step.py on CPU, tests/gpu/test_overlap_gpu.py on CUDA).
Checkpoints are unchanged: the optimizer's param_groups are viewed per chunk only inside a step.

Anything that reads parameters or optimizer state outside the forward (checkpoint save, export)
must call `sync()` first.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from align.config import OptimizerConfig
from align.parallel.grad import foreach_norms


def param_chunks(
    model: torch.nn.Module, blocks: Sequence[torch.nn.Module], params: Sequence[torch.nn.Parameter]
) -> list[list[torch.nn.Parameter]]:
    """`params` split in the order the forward needs them: chunk 0 holds everything outside the
    blocks (embeddings, final norm, head: the forward's start waits for it), chunk i+1 block i's."""
    wanted = {id(p) for p in params}
    in_block: set[int] = set()
    per_block = []
    for block in blocks:
        mine = [p for p in block.parameters() if id(p) in wanted and id(p) not in in_block]
        in_block.update(id(p) for p in mine)
        per_block.append(mine)
    rest = [p for p in params if id(p) not in in_block]
    return [rest, *per_block]


@contextlib.contextmanager
def viewed(optimizer: torch.optim.Optimizer, ids: set[int]) -> Iterator[None]:
    """Within: the optimizer's groups are viewed (same hyperparameters as they are now, the params
    whose id() is in `ids`); restored after. The per-parameter state (moments, step counts) is keyed
    by parameter, so it is shared."""
    groups = optimizer.param_groups
    view = [dict(g, params=[p for p in g["params"] if id(p) in ids]) for g in groups]
    optimizer.param_groups = [g for g in view if g["params"]]
    try:
        yield
    finally:
        optimizer.param_groups = groups


def step_subset(optimizer: torch.optim.Optimizer, ids: set[int]) -> None:
    """`optimizer.step()` over the parameters whose id() is in `ids`."""
    with viewed(optimizer, ids):
        optimizer.step()


class CudaStreams:
    """The stream operations OverlappedStep needs (a fake stands in for it in the CPU tests)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device=device)

    def side_waits_for_main(self) -> None:
        self.side.wait_stream(torch.cuda.current_stream(self.device))

    def on_side(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.side)

    def keep_for_side(self, t: torch.Tensor) -> None:
        """`t` was made on the main stream and is read on the side one: its memory must not be reused
        before the side stream is done with it (the main stream frees gradients at zero_grad)."""
        t.record_stream(self.side)

    def record(self) -> Any:
        return self.side.record_event()

    def main_waits(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)


class OverlappedStep:
    """Drop-in for `optimizer.step()` in the loop: `step()` queues the chunks on the side stream and
    returns at once; the forward pre-hooks make the main stream wait for each chunk's event.

    `compiled`: each chunk steps through that CompiledStep's update (both options on) instead of
    the optimizer's own kernels; its norm becomes this stepper's `norms_of`."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        blocks: Sequence[torch.nn.Module],
        streams: Any,
        compiled: Optional[CompiledStep] = None,
    ) -> None:
        self.optimizer = optimizer
        self.streams = streams
        self.compiled = compiled
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.chunks = param_chunks(model, blocks, params)
        self._ids = [{id(p) for p in c} for c in self.chunks]
        self.norms_of = compiled.norms_of if compiled is not None else foreach_norms
        self.recompile_limit = compiled.allow_param_lists(len(self.chunks)) if compiled is not None else None
        self._events: list[Optional[Any]] = [None] * len(self.chunks)
        self._handles = [model.register_forward_pre_hook(self._waiter(0))]
        self._handles += [b.register_forward_pre_hook(self._waiter(i + 1)) for i, b in enumerate(blocks)]

    def info(self) -> dict[str, Any]:
        info = {
            "kind": "overlap",
            "overlap": True,
            "compiled": False,
            "chunks": len(self.chunks),
            "params_per_chunk": [len(c) for c in self.chunks],
        }
        if self.compiled is not None:
            info.update(kind="overlap+compiled", compiled=True, recompile_limit=self.recompile_limit)
        return info

    def _updates(self) -> contextlib.AbstractContextManager[Callable[[], None]]:
        """The update of whatever the param_groups hold when it is called. The fused step reads the
        clip scale from `optimizer.grad_scale` itself, for every chunk."""
        return self.compiled.updates() if self.compiled is not None else contextlib.nullcontext(self.optimizer.step)

    def _waiter(self, i: int) -> Callable:
        def hook(module, args):
            self.wait(i)

        return hook

    def wait(self, i: int) -> None:
        event, self._events[i] = self._events[i], None
        if event is not None:
            self.streams.main_waits(event)

    def sync(self) -> None:
        """The main stream waits for every queued chunk: call before reading parameters or optimizer
        state outside the forward (checkpoint, export), and before queuing the next step."""
        for i in range(len(self._events)):
            self.wait(i)

    def step(self) -> None:
        self.sync()  # a chunk the last forward never reached (an unused block) still orders before this step
        self.streams.side_waits_for_main()  # gradients, their norm and the clip scale are ready
        scale = getattr(self.optimizer, "grad_scale", None)  # the folded clip (align.parallel.grad)
        for t in [p.grad for c in self.chunks for p in c if p.grad is not None] + (
            [scale] if scale is not None else []
        ):
            self.streams.keep_for_side(t)
        with self.streams.on_side(), self._updates() as update:
            for i, ids in enumerate(self._ids):
                with viewed(self.optimizer, ids):
                    update()
                self._events[i] = self.streams.record()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class PlainStep:
    """`optimizer.step()` as is."""

    norms_of = staticmethod(foreach_norms)

    def __init__(self, optimizer: torch.optim.Optimizer, reason: str) -> None:
        self.optimizer = optimizer
        self.reason = reason

    def info(self) -> dict[str, Any]:
        return {"kind": "plain", "overlap": False, "compiled": False, "reason": self.reason}

    def step(self) -> None:
        self.optimizer.step()

    def sync(self) -> None:
        pass


def _fp64_norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.linalg.vector_norm(g, 2.0, dtype=torch.float64) for g in grads]


class CompiledStep:
    """`optimizer.step()` through torch.compile (torch's compiled-optimizer recipe: the foreach
    implementation, capturable, a tensor learning rate).

    The optimizer keeps float learning rates (scheduler, checkpoints and logs see floats); each step
    copies them into persistent device tensors and hands those in for the call, so a schedule changes
    no compiled constant and nothing recompiles. The clip scale that `clip_grad_norm_` leaves in
    `optimizer.grad_scale` (see `align_folds_clip`) is divided out of the gradients in a compiled
    graph of its own: torch's `Optimizer.step` wrapper breaks the graph on entry (`_use_grad`), so
    the division is not fused into the update's pass (seen with dynamo on CPU, torch 2.13).

    The graphs live in dynamo's cache of torch's `Adam.step` code, one entry per list of parameters
    it is called on: OverlappedStep's chunks each add theirs (`allow_param_lists`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device, backend: str = "inductor") -> None:
        """`backend`: torch.compile's; the CPU tests use "eager" (dynamo's guards and recompiles
        without code generation)."""
        self.optimizer = optimizer
        optimizer.align_folds_clip = True
        self.lr = [torch.tensor(float(g["lr"]), device=device) for g in optimizer.param_groups]
        # Static shapes: a second parameter list on the same code (OverlappedStep's chunks) would
        # otherwise turn its sizes dynamic, and torch 2.11's dynamo then fails building that graph's
        # guards (IndexError in produce_guards, seen on CUDA). Each list gets its own static graph.
        self._plain = torch.compile(self._step, backend=backend, dynamic=False)
        self._scaled = torch.compile(
            self._step_scaled, backend=backend, dynamic=False
        )  # compiled the first time a step clips
        # The gradient norm before the step, compiled too: torch's fp64 _foreach_norm is a
        # bandwidth-bound pass of its own over the gradients (its cost:
        # docs/benchmarks/log.md#e-2026-11-30-moe-optimizer).
        self.norms_of = torch.compile(_fp64_norms, backend=backend, dynamic=False)

    def info(self) -> dict[str, Any]:
        return {"kind": "compiled", "overlap": False, "compiled": True}

    def allow_param_lists(self, n: int, config: Any = None) -> int:
        """Let dynamo keep the graphs of `n` parameter lists (a chunk's view each) compiled: two
        entries per list on the same code (the first step traces while the optimizer state is being
        created, the next one with it complete). Past `recompile_limit` (8 by default) dynamo
        silently runs a frame eagerly, so the limit is raised to that need (never lowered). Returns
        the limit now in force, for the manifest."""
        config = torch._dynamo.config if config is None else config
        if not hasattr(config, "recompile_limit"):
            from align.errors import ConfigError

            raise ConfigError(
                "optimizer.compile",
                f"with optimizer.overlap=true needs torch._dynamo.config.recompile_limit, "
                f"which torch {torch.__version__} lacks; set optimizer.overlap=false",
                True,
            )
        need = 2 * n
        config.recompile_limit = max(config.recompile_limit, need)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, need)
        return config.recompile_limit

    def _step(self) -> None:
        self.optimizer.step()

    def _step_scaled(self, scale: torch.Tensor) -> None:
        torch._foreach_div_(
            [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None], scale
        )
        self.optimizer.step()

    @contextlib.contextmanager
    def updates(self) -> Iterator[Callable[[], None]]:
        """Within: `update()` runs the compiled step over the parameters the param_groups hold when
        it is called (all, or a view of a chunk's), with this step's learning rates (copied into the
        persistent tensors, on the stream current at entry) and clip scale (taken off the optimizer:
        the foreach step takes no grad_scale). The float learning rates are back after."""
        opt = self.optimizer
        scale, opt.grad_scale = getattr(opt, "grad_scale", None), None
        floats = [g["lr"] for g in opt.param_groups]
        for g, t, lr in zip(opt.param_groups, self.lr, floats):
            t.fill_(lr)
            g["lr"] = t
        try:
            yield self._plain if scale is None else functools.partial(self._scaled, scale)
        finally:
            for g, lr in zip(opt.param_groups, floats):
                g["lr"] = lr

    def step(self) -> None:
        with self.updates() as update:
            update()

    def sync(self) -> None:
        pass


def build_stepper(
    cfg: OptimizerConfig, optimizer: torch.optim.Optimizer, model: torch.nn.Module, device: torch.device
) -> OverlappedStep | CompiledStep | PlainStep:
    """What `optimizer.compile` / `optimizer.overlap` resolve to here (config validation already
    refused the combinations that cannot hold: overlap under parallel!=single or compiled blocks,
    compile with another optimizer than adamw; `optimizer.compile=auto` is resolved by then, see
    align.plan.compile_auto.resolve_compile)."""
    if cfg.compile not in (True, False):
        raise ValueError(f"optimizer.compile={cfg.compile!r} reached the stepper unresolved")
    if not (cfg.compile or cfg.overlap):
        return PlainStep(optimizer, "optimizer.overlap=false, optimizer.compile=false")
    if device.type != "cuda":
        why = (
            [f"optimizer.compile: device {device.type}: the compiled step is capturable, a CUDA feature"]
            if cfg.compile
            else []
        )
        why += [f"optimizer.overlap: device {device.type}: side streams are a CUDA feature"] if cfg.overlap else []
        return PlainStep(optimizer, "; ".join(why))
    compiled = CompiledStep(optimizer, device) if cfg.compile else None
    if not cfg.overlap:
        return compiled
    if type(optimizer).__module__.startswith("bitsandbytes"):
        # its step indexes per-group configs by position: a view of the groups would shift them
        from align.errors import ConfigError

        raise ConfigError("optimizer.overlap", "does not work with bitsandbytes' AdamW8bit; use optimizer=adamw")
    from align.parallel.fsdp import decoder_blocks

    return OverlappedStep(optimizer, model, decoder_blocks(model), CudaStreams(device), compiled)
