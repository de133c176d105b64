"""What every probe shares: the trainer built exactly as `align.train` builds it, batches made by the
trainer's own collate, and timers that wrap the trainer's own calls.

A probe that re-implements the training step measures the probe, so nothing here runs a
model, a loss or a collate of its own: `build_trainer` is `Trainer.build`, a timed pass is
`Trainer.forward_backward`, a step is `Trainer.train_step`, and the loss timer wraps the SFT objective's `loss_fn`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from align.config import TrainConfig
from align.data.collate import Batch, collate
from align.data.encode import EncodedDataset
from align.plan.planner import Plan
from align.telemetry.throughput import document_lengths
from align.trainer import Trainer

LOSS_CAVEAT = (
    "CE forward only (the loss call, incl. the fp32 upcast of the logits), timed with CUDA events on GPU: "
    "the CE backward and any activation-checkpoint recompute run inside .backward(), outside this window; "
    "the loss's full cost is larger than this number"
)


def build_trainer(cfg: TrainConfig, out_dir: Path, plan: Optional[Plan] = None) -> Trainer:
    """The same build as `python -m align.train`, on the plan of the preflight the door (align/tools/probe.py)
    ran on the config: one plan per probe job, as per training job; the probe then drives it."""
    return Trainer.build(cfg, out_dir, plan=plan)


def train_step(trainer: Trainer, batches: Any) -> dict[str, Any]:
    """One real `Trainer.train_step`; its metrics row (the trainer may also return a verdict beside it)."""
    out = trainer.train_step(batches)
    return out[0] if isinstance(out, tuple) else out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Intervals on the device timeline: CUDA events on GPU (no sync while recording), wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._open: list[Any] = []
        self._done: list[Any] = []

    def start(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._open.append(e)
        else:
            self._open.append(time.perf_counter())

    def stop(self) -> None:
        s = self._open.pop()
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._done.append((s, e))
        else:
            self._done.append(time.perf_counter() - s)

    def take(self) -> list[float]:
        """Seconds of every interval since the last take (synchronizes on GPU)."""
        if self.cuda:
            sync(self.device)
            out = [s.elapsed_time(e) / 1e3 for s, e in self._done]
        else:
            out = list(self._done)
        self._done = []
        return out


class Instrument:
    """Wrap the trainer's `forward_backward` and `loss_fn` on the INSTANCE for the duration of a `with`:
    the trainer's code runs unchanged, the probe reads per-micro-batch fwd+bwd and CE-forward times."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.fwd_bwd = Stopwatch(trainer.env.device)
        self.loss = Stopwatch(trainer.env.device)
        self.segments: list[list[tuple[int, int]]] = []

    def __enter__(self) -> "Instrument":
        t = self.trainer
        self._fb, self._loss = t.forward_backward, t.objective.loss_fn
        t.forward_backward = self._wrap_fb(self._fb)
        t.objective.loss_fn = self._wrap_loss(self._loss)
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.trainer.forward_backward  # the instance attribute; the class method shows through again
        self.trainer.objective.loss_fn = self._loss

    def _wrap_fb(self, fn: Callable) -> Callable:
        def timed(b: Batch, denom: int) -> torch.Tensor:
            self.segments.append(batch_segments(b))
            self.fwd_bwd.start()
            out = fn(b, denom)
            self.fwd_bwd.stop()
            return out

        return timed

    def _wrap_loss(self, fn: Callable) -> Callable:
        def timed(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            self.loss.start()
            out = fn(logits, labels)
            self.loss.stop()
            return out

        return timed

    def take(self) -> dict[str, list]:
        out = {"segments": self.segments, "fwd_bwd_s": self.fwd_bwd.take(), "ce_forward_s": self.loss.take()}
        self.segments = []
        return out


def fixed_width_batch(data: EncodedDataset, rows: int, width: int, pad_id: int) -> Batch:
    """`rows` rows of exactly `width` real tokens (the data's token stream, tiled), through the
    trainer's collate: no padding, so no attention mask, the shape the scaling fit needs."""
    idx = np.arange(rows * width) % len(data.tokens)
    tiled = EncodedDataset(
        tokens=data.tokens[idx], loss_mask=data.loss_mask[idx], offsets=np.arange(rows + 1, dtype=np.int64) * width,
        ids=[f"probe:{i}" for i in range(rows)], roots=["probe"] * rows,
    )
    return collate(tiled, np.arange(rows), pad_id)


def time_forward_backward(trainer: Trainer, batch: Batch, warmup: int, repeats: int) -> dict[str, Any]:
    """Best-of-`repeats` fwd+bwd of `batch` after `warmup` passes; gradients cleared between passes
    (outside the timed window) the way the trainer clears them after a step."""
    device = trainer.env.device
    denom = max(batch.loss_tokens, 1)
    times, ce = [], []
    with Instrument(trainer) as inst:
        for i in range(warmup + repeats):
            sync(device)
            t0 = time.perf_counter()
            trainer.forward_backward(batch, denom)
            sync(device)
            dt = time.perf_counter() - t0
            trainer.model.zero_grad(set_to_none=True)
            got = inst.take()
            if i >= warmup:
                times.append(dt)
                ce.append(sum(got["ce_forward_s"]))
    best = int(np.argmin(times))
    return {"best_s": times[best], "all_s": times, "ce_forward_s": ce[best]}


def batch_segments(b: Batch) -> list[tuple[int, int]]:
    """The (rows, width) pieces attention runs over in a micro-batch: the whole padded batch, or each
    document of a packed one (its `position_ids` restart at 0 per document)."""
    pos = getattr(b, "position_ids", None)
    if pos is None:
        return [tuple(b.input_ids.shape)]
    return [(1, n) for n in document_lengths(pos)]


def sampled_segments(trainer: Trainer, epoch: int = 0) -> list[list[tuple[int, int]]]:
    """`batch_segments` of every micro-batch this rank would see in `epoch`, from the trainer's own
    sampler and collate: the shapes the run actually computes on."""
    s = trainer.stream
    kw = {"packed": True} if getattr(s, "packed", False) else {}
    return [batch_segments(collate(s.data, rows, s.pad_id, s.mult, **kw)) for rows in s.sampler.rank_batches(epoch)]


def model_summary(trainer: Trainer) -> dict[str, Any]:
    ac = trainer.autocast()
    return {
        **trainer.model_info,
        "device": str(trainer.env.device),
        "device_name": torch.cuda.get_device_name(trainer.env.device) if trainer.env.device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
        "autocast_dtype": str(ac.fast_dtype).removeprefix("torch.") if isinstance(ac, torch.autocast) else None,
        "micro_batch_size": trainer.cfg.sampler.micro_batch_size,
        "grad_accum": trainer.cfg.trainer.grad_accum,
    }


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "value"):
        return o.value
    return str(o)


def fmt_s(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:,.3f} ms"
