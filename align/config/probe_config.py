"""Schemas of `python -m align.tools.probe` (the probe group)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from align.config.rules import _only, _read, _require

# ----------------------------------------------------------------------------------------- probe


@dataclass
class ScalingProbeConfig:
    lengths: list[int] = field(default_factory=lambda: [128, 256, 512])
    """Sequence lengths w to time fwd+bwd at (>= 3 distinct: a 2-point fit is undetermined, docs/triage.md#3)."""
    batch_size: Optional[int] = None
    """Rows per timed batch, fixed across lengths; null: `sampler.micro_batch_size`."""
    warmup: int = 1
    """Untimed fwd+bwd passes at each length before timing."""
    repeats: int = 2
    """Timed passes at each length; the best (fastest) one is kept."""
    residual_tol: float = 0.01
    """A fit 'closes' when every relative residual is within plus or minus this."""
    measure_steps: int = 3
    """Real trainer steps on the real data stream, timed to check the prediction against (after one warm-up step)."""

    def __post_init__(self) -> None:
        _require(len(set(self.lengths)) >= 3, "probe.scaling.lengths",
                 "needs at least 3 distinct lengths: a 2-point fit over {linear, quadratic, fixed} is undetermined "
                 "(docs/triage.md#3)", self.lengths)
        _require(all(w >= 1 for w in self.lengths), "probe.scaling.lengths", "every length must be >= 1", self.lengths)
        if self.batch_size is not None:
            _require(self.batch_size >= 1, "probe.scaling.batch_size", "must be >= 1 or null", self.batch_size)
        _require(self.warmup >= 0, "probe.scaling.warmup", "must be >= 0", self.warmup)
        _require(self.repeats >= 1, "probe.scaling.repeats", "must be >= 1", self.repeats)
        _require(0 < self.residual_tol < 1, "probe.scaling.residual_tol", "must be in (0, 1)", self.residual_tol)
        _require(self.measure_steps >= 1, "probe.scaling.measure_steps", "must be >= 1", self.measure_steps)


@dataclass
class KernelsProbeConfig:
    warmup: int = 2
    """Untimed trainer steps first (allocator, kernel selection, autotuning)."""
    timed_steps: int = 3
    """Trainer steps timed WITHOUT the profiler: throughput and MFU come from these."""
    steps: int = 3
    """Trainer steps under torch.profiler: the kernel table and launches per step come from these."""
    trace: bool = False
    """Also write a Chrome trace (trace.json, can be large) of the profiled steps."""

    def __post_init__(self) -> None:
        _require(self.warmup >= 0, "probe.kernels.warmup", "must be >= 0", self.warmup)
        _require(self.timed_steps >= 1, "probe.kernels.timed_steps", "must be >= 1", self.timed_steps)
        _require(self.steps >= 1, "probe.kernels.steps", "must be >= 1", self.steps)


@dataclass
class MaskProbeConfig:
    records: int = 64
    """Records encoded to make the probe's batches (real tokens; the probe needs few)."""
    length: Optional[int] = None
    """Tokens per probe row; null: sliding_window + 16 (at least 64), so the window binds."""

    def __post_init__(self) -> None:
        _require(self.records >= 1, "probe.mask.records", "must be >= 1", self.records)
        if self.length is not None:
            _require(self.length >= 2, "probe.mask.length", "must be >= 2 or null", self.length)


@dataclass
class PaddingProbeConfig:
    bucket_sizes: list[int] = field(default_factory=lambda: [2, 8, 32, 128, 512, 0])
    """Bucket sizes swept beside a pure shuffle; 0 means the whole data set (a full length sort)."""
    window: Optional[int] = None
    """Micro-batches per accumulation window for roots/window; null: trainer.grad_accum."""

    def __post_init__(self) -> None:
        _require(all(b >= 0 for b in self.bucket_sizes), "probe.padding.bucket_sizes", "must be >= 0 (0: all)",
                 self.bucket_sizes)
        if self.window is not None:
            _require(self.window >= 1, "probe.padding.window", "must be >= 1 or null", self.window)


@dataclass
class ProbeConfig:
    """Options of `python -m align.tools.probe probe=<name>`; `align.train` does not read them."""

    name: Optional[str] = None
    """Which probe runs (the option of the `probe` group): see align/tools/probe.py for those available."""
    scaling: ScalingProbeConfig = field(default_factory=ScalingProbeConfig)
    """`probe=scaling`: the step's scaling curve t(w) = A*w + B*w^2 (docs/triage.md#3)."""
    kernels: KernelsProbeConfig = field(default_factory=KernelsProbeConfig)
    """`probe=kernels`: device-kernel table from torch.profiler (docs/triage.md#5)."""
    mask: MaskProbeConfig = field(default_factory=MaskProbeConfig)
    """`probe=mask`: attention-mask band structure per layer type (docs/triage.md#2)."""
    padding: PaddingProbeConfig = field(default_factory=PaddingProbeConfig)
    """`probe=padding`: the bucket sweep from the data alone (docs/triage.md#4)."""

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`). align.train composes
        no probe (name null): every probe's options are then unread."""
        subs = ("scaling", "kernels", "mask", "padding")
        if self.name is None:
            return {s: f"ignored by align.train; it is read by `python -m align.tools.probe {key}={s}`" for s in subs}
        return _read({s: _only(key, self.name, [s]) for s in subs})
