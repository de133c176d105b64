"""What lowers a training-memory estimate that does not fit: the keys of the composed run whose change
makes the estimate (align/plan/memory.py) smaller, each tried on the planned config and named with
the value tried and the estimate it gives (align.run.model_checks puts them in its refusal).

The candidates follow the objective and the sampler: a rollout's micro-batches (objective=grpo) are cut
by `trainer.grad_accum` or `sampler.max_tokens` from `objective.prompts_per_rollout x group_size`
completions of at most the longest prompt + `objective.max_new_tokens` tokens, so
`sampler.micro_batch_size` and `data.max_seq_len` (a bound the real prompts sit under) are not
candidates there; SFT and DPO take `sampler.micro_batch_size` rows at `data.max_seq_len`, or
`sampler.max_tokens` under sampler=budget. A candidate the config refuses, or that leaves the estimate
where it is, is not named.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from align.config import SamplerKind, TrainConfig
from align.errors import ConfigError
from align.objectives.plan_terms import terms_for
from align.plan.memory import GiB, estimate_memory


def _candidates(cfg: TrainConfig) -> list[tuple[str, Any]]:
    """(key, value to try) for the composition of `cfg` (planned: `auto`s resolved): the token budget,
    the keys the objective's micro-batches and generation are cut by (align/objectives/plan_terms.py
    `levers`), then what lowers any run's activations, logits and state."""
    from align.plan.chunk_auto import CHUNK

    s = cfg.sampler
    budget = s.kind == SamplerKind.budget
    out: list[tuple[str, Any]] = [("sampler.max_tokens", s.max_tokens // 2)] if budget else []
    out += terms_for(cfg).levers(cfg, budget)
    out += [("parallel.activation_checkpointing", True), ("trainer.loss_chunk_tokens", CHUNK),
            ("model.lora.enabled", True)]
    return out


def _with(obj: Any, dotted: str, value: Any) -> Any:
    """`obj` with the dotted field set to `value` (each level rebuilt, so every check runs again)."""
    head, _, rest = dotted.partition(".")
    return dataclasses.replace(obj, **{head: _with(getattr(obj, head), rest, value) if rest else value})


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def levers(cfg: TrainConfig, device: torch.device, shards: int = 1, prompt_tokens: Optional[int] = None
           ) -> list[str]:
    """`key=value (~N GiB)` for each candidate that lowers the estimate of the planned `cfg`, largest
    drop first."""
    base = estimate_memory(cfg, device, shards=shards, prompt_tokens=prompt_tokens).total
    found = []
    for key, value in _candidates(cfg):
        if _get(cfg, key) == value:
            continue
        try:
            trial = _with(cfg, key, value)
        except (ConfigError, ValueError, TypeError):  # a value the config refuses (e.g. below its least)
            continue
        total = estimate_memory(trial, device, shards=shards, prompt_tokens=prompt_tokens).total
        if total < base:
            shown = str(value).lower() if isinstance(value, bool) else getattr(value, "value", value)
            found.append((total, f"{key}={shown} (~{total / GiB:.1f} GiB)"))
    return [text for _, text in sorted(found, key=lambda t: t[0])]
