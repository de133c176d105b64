"""The optimizer boundary: ONE all-reduce that every rank takes part in, carrying the stop flag,
the non-finite-loss flag and the numbers the history logs. Flags are counts of ranks (a sum of 0/1,
equivalent to a MAX for "did any rank"), so every rank sees the same values and takes the same branch:
no rank can stop, skip or halt alone and leave the others waiting in a collective."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from align.parallel.env import DistEnv


@dataclass(frozen=True)
class Verdict:
    stop_ranks: int
    """Ranks that received a stop signal since the last boundary."""
    nonfinite_loss_ranks: int
    """Ranks whose window loss was nan/inf."""
    grad_norm: float
    """Global pre-clip gradient norm (identical on every rank)."""
    loss: float
    """Loss per loss token over the whole window, all ranks."""
    tokens: int
    real_tokens: int

    @property
    def stop(self) -> bool:
        return self.stop_ranks > 0

    @property
    def skip_cause(self) -> Optional[str]:
        """Why this step must be skipped on every rank, or None to apply it."""
        causes = []
        if self.nonfinite_loss_ranks:
            causes.append(f"non-finite loss on {self.nonfinite_loss_ranks} rank(s)")
        if not math.isfinite(self.grad_norm):
            causes.append(f"non-finite gradient norm ({self.grad_norm})")
        return " and ".join(causes) or None


def agree(env: DistEnv, stop: bool, loss_part: float, grad_norm: float, tokens: int, real_tokens: int) -> Verdict:
    """`loss_part` is this rank's share of the window loss (its sum over the global loss tokens), read
    to the host. One process agrees with itself on the host, without a device round trip."""
    row = [float(stop), float(not math.isfinite(loss_part)), loss_part, tokens, real_tokens]
    if env.distributed:
        v = torch.tensor(row, dtype=torch.float64, device=env.device)
        env.all_reduce_sum(v)
        row = v.tolist()
    s, nf, loss, tok, real = row
    return Verdict(stop_ranks=int(s), nonfinite_loss_ranks=int(nf), grad_norm=grad_norm, loss=loss,
                   tokens=int(tok), real_tokens=int(real))

