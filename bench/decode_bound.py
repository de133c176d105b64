"""The bytes a decode step must move, over the device's measured copy bandwidth: the floor under a
generation arm's time, and the arm's share of it.

A decode step reads every weight once and every live row's keys and values once (at least). For a call
that generated completions of lengths `n_r` after prompts of lengths `p_r`, with at most `rows` rows
decoding at once, the bytes are at least

    steps * weight_bytes + sum_r sum_{t < n_r} (p_r + t) * kv_bytes_per_token,
    steps = ceil(sum_r n_r / rows)

(the fewest steps that can produce the tokens, each reading all weights). The bandwidth is measured in
the same process: a device-to-device copy of a 4 GiB buffer, (bytes read + bytes written) / seconds.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch


def copy_bandwidth(device: torch.device, gib: float = 4.0, repeats: int = 5) -> float:
    """Bytes per second of a device copy (read + write), the best of `repeats`."""
    if device.type != "cuda":
        return float("nan")
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / best


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Keys and values of one token over every layer that stores them (sliding layers counted whole: an
    upper bound on what a short sequence reads)."""
    total = 0
    for m in model.modules():
        if hasattr(m, "layer_idx") and getattr(m, "k_proj", None) is not None and hasattr(m, "head_dim"):
            total += 2 * m.k_proj.out_features * m.k_proj.weight.element_size()
    return total


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def bound(model: torch.nn.Module, prompt_lengths: Sequence[int], completion_lengths: Sequence[int], rows: int,
          bandwidth: float, active_weight_bytes: int | None = None) -> dict[str, Any]:
    """The floor for one call: seconds and tokens/s at `bandwidth`. `active_weight_bytes`: what one step
    reads of a mixture-of-experts model's weights (all of them, by default)."""
    kv = kv_bytes_per_token(model)
    generated = sum(completion_lengths)
    steps = math.ceil(generated / rows)
    kv_read = sum(n * p + n * (n - 1) // 2 for p, n in zip(prompt_lengths, completion_lengths)) * kv
    w = weight_bytes(model) if active_weight_bytes is None else active_weight_bytes
    total = steps * w + kv_read
    seconds = total / bandwidth
    return {"bytes": total, "weight_bytes_per_step": w, "kv_bytes_per_token": kv, "min_steps": steps,
            "bandwidth_bytes_per_s": bandwidth, "seconds": seconds, "tokens_per_s": generated / seconds}
