"""One plan per job: every size and switch `auto` leaves to the device, resolved once where the job's
device is known, and the training-memory estimate they are counted by (docs/architecture.md, "The plan").

`plan(cfg, device)` runs once in a job's process, in its preflight's memory check
(align/run/model_checks.py), whose report carries the result (`Report.plan`, align/run/checklist.py);
the manifest's serving viability (align/run/serving.py) and `Trainer.build` read that report's plan
(align/train.py). A Trainer built without one (a test, in-process use) makes its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

    from align.config import TrainConfig
    from align.plan.memory import MemoryEstimate


@dataclass(frozen=True)
class Plan:
    """What `auto` stands for in one job, and the estimate of its peak, each record as the manifest shows it."""

    requested: "TrainConfig"
    """The config as composed (every `auto` as given): the one the plan was made for."""
    device: "torch.device"
    """The device the job's process trains on (align.parallel.env.job_device)."""
    sized: "TrainConfig"
    """`requested` with every size resolved (the loss chunk, the engine's dtype and rows, the partitioner's
    budget, the token budget) and the compile switches as given: what the estimate and the keys a memory
    refusal names (align/plan/memory_levers.py) are counted on."""
    cfg: "TrainConfig"
    """`sized` with the compile switches resolved too: the config the trainer runs."""
    estimate: "MemoryEstimate"
    """The training-memory estimate of `sized` on `device` (preflight's check, the serving viability)."""
    prompt_tokens: Optional[int]
    """The longest prompt of an objective that generates (its rollouts' width); None otherwise."""
    sizes: dict[str, Optional[dict[str, Any]]]
    """The manifest's `loss_chunk`, `memory_budget` and `sampler_budget` records, and where the objective
    generates `generation` and `rollout_width` (`model.extra`): requested, resolved, why."""
    compile: dict[str, dict[str, Any]]
    """The manifest's `compile.trainer`, `compile.optimizer` and `compile.loss`: requested, resolved, why."""

    def for_trainer(self, cfg: "TrainConfig", device: "torch.device"
                    ) -> tuple["TrainConfig", dict[str, Any], dict[str, Any]]:
        """The resolved config and copies of the records, for the trainer of `cfg` on `device` to add its
        own to (the run length; what the compile switches set in its process). A plan made for another
        config or device is refused: a trainer never runs the sizes of another job."""
        if cfg != self.requested or device != self.device:
            what = "device " + str(device) if cfg == self.requested else "config"
            raise ValueError(f"the job's plan was made for {self.device} and its own config; this trainer's "
                             f"{what} differs")
        return self.cfg, dict(self.sizes), dict(self.compile)


def plan(cfg: "TrainConfig", device: "torch.device", shards: int = 1) -> Plan:
    """The job's plan on `device`: the sizes first (align/plan/budget_auto.py `plan_sizes`, each counted
    by the estimate of the next), the estimate of the sized config (`shards`: ranks sharing the
    weights, grads and optimizer state), then the compile switches (align/plan/compile_auto.py)."""
    from align.plan.budget_auto import plan_sizes
    from align.plan.compile_auto import resolve_compile
    from align.plan.memory import estimate_memory

    sized, sizes = plan_sizes(cfg, device)
    prompt_tokens = (sizes.get("rollout_width") or {}).get("prompt_tokens")
    estimate = estimate_memory(sized, device, shards=shards, prompt_tokens=prompt_tokens)
    resolved, switches = resolve_compile(sized, device.type)
    return Plan(cfg, device, sized, resolved, estimate, prompt_tokens, sizes, switches)
