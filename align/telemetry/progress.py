"""A progress bar on rank 0 (step, loss, tokens/s, ETA) when stderr is a TTY; otherwise a log line
every `log_every` steps, so CI logs and Slurm files stay readable."""

from __future__ import annotations

import sys
import time
from typing import Optional

from tqdm import tqdm

from align.parallel.compile import compile_seconds


class Progress:
    def __init__(self, total: int, initial: int, enabled: bool, log_every: int) -> None:
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.log_every = log_every
        self.total = total
        self.t0 = time.perf_counter()
        self.start_step = initial
        self.compile0 = compile_seconds()  # an earlier run of this process (a sweep, a test) compiled too
        self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, disable=not self.tty, unit="step")

    def update(self, step: int, loss: float, tokens_per_s: float, step_time_s: Optional[float] = None) -> None:
        if step == self.start_step + 1 and step_time_s is not None:
            self.first_step(step_time_s)
        if self.tty:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        elif self.enabled and (step % self.log_every == 0 or step == self.total):
            done = step - self.start_step
            rate = done / max(time.perf_counter() - self.t0, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else float("inf")
            print(f"step {step}/{self.total} loss {loss:.4f} tok/s {tokens_per_s:,.0f} eta {eta:,.0f}s"
                  + self.compile_share(), file=sys.stderr, flush=True)

    def first_step(self, seconds: float) -> None:
        """The first step pays the compiles and the autotuning: say how long it took and how much of it
        was compiling, so a slow start reads as what it is."""
        spent = compile_seconds() - self.compile0
        line = f"first step {seconds:,.1f}s" + (f" (compiling {spent:,.1f}s so far)" if spent else "")
        if self.tty:
            self.bar.write(line, file=sys.stderr)
        elif self.enabled:
            print(line, file=sys.stderr, flush=True)

    def compile_share(self) -> str:
        spent = compile_seconds() - self.compile0
        return f" compile {spent / max(time.perf_counter() - self.t0, 1e-9):.0%} of the wall" if spent else ""

    def close(self) -> None:
        self.bar.close()
