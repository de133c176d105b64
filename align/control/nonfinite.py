"""Non-finite steps: skipped on every rank; more than `trainer.max_consecutive_skipped_steps` in a
row halt every rank with the same message, HALT.json and exit 81. Non-finite parameters (an applied
step can make them so from a finite gradient, e.g. with a huge learning rate) are never written: the
trainer checks before every checkpoint, before the export and at the end, and halts the same way."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.tensor import DTensor

# ---- TEST-ONLY injection hook: the one place align reads it. -----------------------------------
# ALIGN_TEST_INJECT_NAN="<rank>:<first>[-<last>]" multiplies that rank's loss by NaN at optimizer
# steps first..last (1-based; "<first>-" = every step from first). Used by the multi-rank tests.
INJECT_ENV = "ALIGN_TEST_INJECT_NAN"


def injected_nan(rank: int, step: int) -> bool:
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return False
    who, _, steps = spec.partition(":")
    first, dash, last = steps.partition("-")
    hi = int(last) if last else (1 << 62 if dash else int(first))
    return int(who) == rank and int(first) <= step <= hi
# -------------------------------------------------------------------------------------------------


def inject(loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    return loss * float("nan") if injected_nan(rank, step) else loss


@dataclass
class SkipStats:
    consecutive: int = 0
    """Skipped optimizer steps in a row, up to the last boundary."""
    total: int = 0
    """Skipped optimizer steps in the whole run."""
    last_cause: Optional[str] = None

    def record(self, cause: Optional[str]) -> None:
        """`cause` is None for an applied step."""
        if cause is None:
            self.consecutive = 0
        else:
            self.consecutive += 1
            self.total += 1
            self.last_cause = cause

    def over(self, limit: int) -> bool:
        return self.consecutive > limit


def halt_message(stats: SkipStats, limit: int) -> str:
    return (f"{stats.consecutive} consecutive non-finite optimizer steps exceed "
            f"trainer.max_consecutive_skipped_steps={limit} (last cause: {stats.last_cause})")


def nonfinite_parameters(model: torch.nn.Module, env: Any) -> list[str]:
    """Names of the parameters holding nan/inf on ANY rank. Collective (`env` is an
    align.parallel.env.DistEnv): each rank looks at its own shards and one all-reduce of per-tensor
    flags gives every rank the same list, so all ranks halt (or write) together."""
    names, flags = [], []
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        names.append(name)
        flags.append(torch.isfinite(local.detach()).all().logical_not())
    if not flags:
        return []
    bad = torch.stack(flags).to(torch.float32)
    env.all_reduce_sum(bad)
    return [n for n, b in zip(names, bad.tolist()) if b]


def parameters_message(bad: list[str], total: int, step: int, refused: str) -> str:
    shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
    return (f"{len(bad)} of {total} parameter tensors hold nan/inf after step {step} ({shown}): {refused}; "
            "lower optimizer.lr or optimizer.max_grad_norm, or look at the data of the steps before")


def write_halt(run_dir: Path, message: str, step: int, stats: SkipStats, extra: dict[str, Any] | None = None) -> Path:
    path = Path(run_dir) / "HALT.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"code": 81, "message": message, "step": step, "skip_stats": asdict(stats),
                               "time": time.time(), **(extra or {})}, indent=2))
    os.replace(tmp, path)
    return path
