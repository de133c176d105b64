"""A progress bar on rank 0 (step, the objective's metrics, tokens/s, ETA) when stderr is a TTY;
otherwise a log line every `log_every` steps, so CI logs and Slurm files stay readable. The lines go
through the `align` logger, so train.log holds them too; under a bar they go to the log files only
(the bar is the console's). `Phase` is the same for a long phase before or between steps (a
reference precompute, an eval, a rollout)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Mapping, Optional, Sequence

from tqdm import tqdm

from align.telemetry.console import Metric, announce_start, metric_fields, watched

log = logging.getLogger("align")


def compile_seconds() -> float:
    """Seconds dynamo and its backend spent compiling in this process so far (forward and backward
    graphs); 0 when nothing was compiled."""
    if "torch._dynamo" not in sys.modules:
        return 0.0
    try:
        from torch._dynamo.utils import calculate_time_spent

        return float(calculate_time_spent().get("total_wall_time", 0.0))
    except Exception:  # an internal that may move between torch releases: the cost is then unknown
        return 0.0


def to_log_files(line: str) -> None:
    """`line` into the file handlers of the `align` logger and the root (train.log), not the console."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, line, None, None)
    for logger in (log, logging.getLogger()):
        for h in logger.handlers:
            if isinstance(h, logging.FileHandler) and record.levelno >= h.level:
                h.handle(record)


class Progress:
    def __init__(self, total: int, initial: int, enabled: bool, log_every: int,
                 metrics: Sequence[Metric] = (("loss", "loss"),)) -> None:
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.log_every = log_every
        self.total = total
        self.metrics = tuple(metrics)
        self.t0 = time.perf_counter()
        self.start_step = initial
        self.compile0 = compile_seconds()  # an earlier run of this process (a sweep, a test) compiled too
        self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, disable=not self.tty, unit="step")

    def update(self, row: Mapping[str, Any]) -> None:
        """One logged step's row (history's): its step, the objective's metrics, tokens/s, step time."""
        step, step_time_s, tokens_per_s = row["step"], row.get("step_time_s"), row.get("tokens_per_s") or 0.0
        if step == self.start_step + 1 and step_time_s is not None:
            self.first_step(step_time_s)
        if self.tty:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{metric_fields(self.metrics, row)} tok/s {tokens_per_s:,.0f}", refresh=False)
        if self.enabled and (step % self.log_every == 0 or step == self.total):
            done = step - self.start_step
            rate = done / max(time.perf_counter() - self.t0, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else float("inf")
            self.say(f"step {step}/{self.total} {metric_fields(self.metrics, row)} tok/s {tokens_per_s:,.0f} "
                     f"eta {eta:,.0f}s" + self.compile_share())

    def say(self, line: str) -> None:
        if self.tty:
            to_log_files(line)
        elif self.enabled:
            log.info(line)

    def first_step(self, seconds: float) -> None:
        """The first step pays the compiles and the autotuning: say how long it took and how much of it
        was compiling, so a slow start reads as what it is."""
        spent = compile_seconds() - self.compile0
        line = f"first step {seconds:,.1f}s" + (f" (compiling {spent:,.1f}s so far)" if spent else "")
        if self.tty:
            self.bar.write(line, file=sys.stderr)
        self.say(line)

    def compile_share(self) -> str:
        spent = compile_seconds() - self.compile0
        return f" compile {spent / max(time.perf_counter() - self.t0, 1e-9):.0%} of the wall" if spent else ""

    def close(self) -> None:
        self.bar.close()


def start_progress(trainer: Any) -> Progress:
    """The run's start block (align/telemetry/console.py), then its progress from the step it starts at."""
    announce_start(trainer)
    t = trainer.cfg.trainer
    return Progress(t.max_steps, trainer.state.step, trainer.env.is_main, t.log_every, watched(trainer.objective))


class Phase:
    """Progress of a long phase of `total` items (None: unknown) on rank 0: a bar on a TTY, else a
    line at the start, about every `every_s` seconds, and at the end; each line also in train.log.
    `quiet`: a phase that recurs every step (a rollout) says nothing unless it lasts `every_s`."""

    def __init__(self, what: str, total: Optional[int] = None, enabled: bool = True, every_s: float = 30.0,
                 quiet: bool = False) -> None:
        self.what, self.total, self.enabled, self.every_s, self.quiet = what, total, enabled, every_s, quiet
        self.tty = enabled and sys.stderr.isatty()
        self.done = 0
        self.t0 = self.t_said = time.perf_counter()
        self.bar = tqdm(total=total, desc=what, dynamic_ncols=True, disable=not self.tty, leave=False)
        if not quiet:
            self.say(f"{what}: started" + (f" ({total:,} to do)" if total else ""))

    def say(self, line: str) -> None:
        if self.tty:
            to_log_files(line)
        elif self.enabled:
            log.info(line)

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)
        now = time.perf_counter()
        if now - self.t_said >= self.every_s:
            self.t_said = now
            self.say(f"{self.what}: {self.done:,}" + (f"/{self.total:,}" if self.total else "")
                     + f" in {now - self.t0:,.0f}s")

    def __enter__(self) -> "Phase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()
        seconds = time.perf_counter() - self.t0
        if exc[0] is None and (not self.quiet or seconds >= self.every_s):
            self.say(f"{self.what}: " + (f"{self.done:,} " if self.done else "") + f"done in {seconds:,.1f}s")
