"""What a GRPO rollout reports: metric sums and extremes reduced over ranks, and the hash that
proves the generation copy holds the training weights (align/objectives/grpo.py uses both)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from align.parallel.env import DistEnv


def state_sha256(model: torch.nn.Module, dtype: Optional[torch.dtype] = None) -> str:
    """The fingerprint of `model.state_dict()` (cast to `dtype`) in the scheme of `Engine.weights_hash`
    (align/generation/fingerprint.py)."""
    from align.generation.fingerprint import fingerprint

    return fingerprint(model.state_dict().items(), dtype)


class Sums:
    """Metric sums, maxima and minima over a window's micro-batches, reduced over ranks when read."""

    def __init__(self) -> None:
        self.sum: dict[str, float | torch.Tensor] = {}
        self.max: dict[str, torch.Tensor] = {}
        self.min: dict[str, torch.Tensor] = {}

    def add(self, key: str, v: Any) -> None:
        self.sum[key] = self.sum.get(key, 0.0) + (v.detach().double() if torch.is_tensor(v) else float(v))

    def extreme(self, key: str, v: torch.Tensor) -> None:
        v = v.detach().double()
        self.max[key] = v.max() if key not in self.max else torch.maximum(self.max[key], v.max())
        self.min[key] = v.min() if key not in self.min else torch.minimum(self.min[key], v.min())

    def reduce(self, env: Optional[DistEnv], device: torch.device) -> tuple[dict[str, float], dict[str, float], dict]:
        names = sorted(self.sum)
        vec = torch.tensor([float(self.sum[k]) for k in names], dtype=torch.float64, device=device)
        ext = sorted(self.max)
        hi = torch.stack([self.max[k] for k in ext]).to(device) if ext else torch.zeros(0, device=device)
        lo = torch.stack([-self.min[k] for k in ext]).to(device) if ext else torch.zeros(0, device=device)
        if env is not None and env.distributed:
            import torch.distributed as dist

            dist.all_reduce(vec)
            if ext:
                both = torch.cat([hi, lo])
                dist.all_reduce(both, op=dist.ReduceOp.MAX)
                hi, lo = both[: len(ext)], both[len(ext):]
        return (dict(zip(names, vec.tolist())), dict(zip(ext, hi.tolist())),
                dict(zip(ext, (-lo).tolist())))
