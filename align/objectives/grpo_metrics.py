"""What a GRPO step's row reports (align/objectives/grpo.py): the rollout's statistics, the trainer-vs-engine
log-prob comparison, the policy loss's clip and ratio, router flips and where the step's time went. Each
rank adds its own numbers to a `Sums` (align/objectives/rollout_stats.py); the row is made from their
reduction over ranks, so every rank's tokens and groups weigh the same."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from align.objectives.policy_loss import k3
from align.objectives.rollout import Rollout
from align.objectives.rollout_stats import Sums

PHASES = ("generation_s", "sync_s", "scoring_s", "old_logps_s", "reference_s")
"""The timed phases of a step (`time/<phase>`); the update is the rest of the step."""


def add_rollout(s: Sums, r: Rollout, group_size: int) -> dict[str, Any]:
    """Add this rank's rollout statistics to `s` as sums; returns the row's entries that are rank 0's own."""
    m = r.meta
    lens = r.loss_lens  # the generated tokens (a multi-turn trajectory's tool messages are not)
    for key, v in (("seqs", r.size), ("reward", r.rewards.sum()), ("reward_sq", (r.rewards ** 2).sum()),
                   ("groups", m["groups"]), ("zero_var", m["zero_variance_groups"]),
                   ("zero_var_first", m["zero_variance_first_round"]), ("abs_adv", np.abs(r.advantages).sum()),
                   ("tokens", lens.sum()), ("stopped", r.stopped.sum()),
                   ("generated", m["groups_generated"] * group_size)):
        s.add(f"ro_{key}", float(v))
    for k, v in m.items():
        if k.startswith("parts/"):
            s.add(f"ro_part/{k.removeprefix('parts/')}", v)
        elif k in ("turns", "tool_calls", "tool_errors"):
            s.add(f"ro_{k}", v)
    # Every rank runs the same rollouts and rounds; the hash is of this rank's copy (rank 0's row).
    return {"rollout/index": r.index, "rollout/rounds": m["rounds"], "rollout/weights_sha256": m["weights_sha256"]}


def rollout_row(sums: dict[str, float]) -> dict[str, Any]:
    """The rollout's entries of the row, from the sums `add_rollout` made, reduced over ranks."""
    n, groups = sums["ro_seqs"], sums["ro_groups"]
    mean = sums["ro_reward"] / n
    row = {"reward/mean": mean, "reward/std": max(sums["ro_reward_sq"] / n - mean ** 2, 0.0) ** 0.5,
           "reward/zero_variance_frac": sums["ro_zero_var"] / groups,
           "reward/zero_variance_first_round": sums["ro_zero_var_first"] / groups,
           "advantage/abs_mean": sums["ro_abs_adv"] / n, "rollout/sequences": int(n),
           "rollout/tokens": int(sums["ro_tokens"]), "rollout/completion_len_mean": sums["ro_tokens"] / n,
           "rollout/stop_frac": sums["ro_stopped"] / n}
    row.update({f"reward/{k.removeprefix('ro_part/')}": v / sums["ro_generated"]
                for k, v in sums.items() if k.startswith("ro_part/")})
    if "ro_turns" in sums:  # multi-turn (align/objectives/multi_turn.py)
        row.update({"rollout/turns_mean": sums["ro_turns"] / n, "rollout/tool_calls_mean": sums["ro_tool_calls"] / n,
                    "rollout/tool_error_frac": sums["ro_tool_errors"] / max(sums["ro_tool_calls"], 1.0)})
    return row


def add_mismatch(s: Sums, trainer: torch.Tensor, engine: torch.Tensor, sampler: torch.Tensor, is_cap: float) -> None:
    """Accumulate the trainer-vs-engine comparison of one micro-batch's completion tokens."""
    d = (trainer.detach().double() - engine.double())
    ratio = torch.exp(trainer.detach().double() - sampler.double())
    s.add("mm_tokens", d.numel())
    s.add("mm_abs", d.abs().sum())
    s.add("mm_kl", k3(trainer.detach().double(), engine.double()).sum())
    s.add("is_sum", ratio.sum())
    s.add("is_sq", (ratio ** 2).sum())
    s.add("is_over_cap", (ratio > is_cap).sum())
    s.extreme("mm_abs", d.abs())
    s.extreme("is_ratio", ratio)


def window_row(sums: dict[str, float], hi: dict[str, float], lo: dict[str, float]) -> dict[str, Any]:
    """The step's entries from the reduced sums, extremes high and low: rollout, policy, mismatch, router flips."""
    row: dict[str, Any] = {}
    if sums.get("ro_seqs"):
        row.update(rollout_row(sums))
    t = sums.get("policy_tokens", 0.0)
    if t:
        row.update({"policy/clip_frac": sums["policy_clipped"] / t, "policy/ratio_mean": sums["policy_ratio"] / t})
        if "policy_kl" in sums:
            row["kl/ref_mean"] = sums["policy_kl"] / t
    if sums.get("mm_tokens"):
        n = sums["mm_tokens"]
        mean = sums["is_sum"] / n
        row.update({"mismatch/logp_abs_mean": sums["mm_abs"] / n, "mismatch/logp_abs_max": hi["mm_abs"],
                    "mismatch/kl": sums["mm_kl"] / n, "mismatch/is_ratio_mean": mean,
                    "mismatch/is_ratio_std": max(sums["is_sq"] / n - mean ** 2, 0.0) ** 0.5,
                    "mismatch/is_ratio_min": lo["is_ratio"], "mismatch/is_ratio_max": hi["is_ratio"],
                    "mismatch/is_over_cap_frac": sums["is_over_cap"] / n})
    if sums.get("rf_tokens"):
        layers = {k: v / sums["rf_tokens"] for k, v in sums.items() if k.startswith("rf/")}
        row.update({f"router_flip/l{k.removeprefix('rf/')}": v for k, v in layers.items()})
        row["router_flip/mean"] = sum(layers.values()) / len(layers)
    return row


def time_row(sums: dict[str, float], timers: dict[str, float], total: Optional[float]) -> dict[str, Any]:
    """Where the step's `total` seconds went: each timed phase, the update as the rest, and the rates."""
    total = total or 0.0
    tm = {k: timers.get(k, 0.0) for k in PHASES}
    update = max(total - sum(tm.values()), 0.0)
    out = {f"time/{k}": v for k, v in tm.items()}
    out.update({"time/update_s": update, "time/generation_share": tm["generation_s"] / total if total else None,
                "time/update_tokens_per_s": sums.get("update_tokens", 0.0) / update if update else None,
                "rollout/tokens_per_s": (sums["ro_tokens"] / tm["generation_s"]
                                         if sums.get("ro_tokens") and tm["generation_s"] else None)})
    return out
