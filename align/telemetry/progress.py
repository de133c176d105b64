"""A progress bar on rank 0 (step, loss, tokens/s, ETA) when stderr is a TTY; otherwise a log line
every `log_every` steps, so CI logs and Slurm files stay readable."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, initial: int, enabled: bool, log_every: int) -> None:
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.log_every = log_every
        self.total = total
        self.t0 = time.perf_counter()
        self.start_step = initial
        self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, disable=not self.tty, unit="step")

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self.tty:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        elif self.enabled and (step % self.log_every == 0 or step == self.total):
            done = step - self.start_step
            rate = done / max(time.perf_counter() - self.t0, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else float("inf")
            print(f"step {step}/{self.total} loss {loss:.4f} tok/s {tokens_per_s:,.0f} eta {eta:,.0f}s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()
