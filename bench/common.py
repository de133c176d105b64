"""Shared by every benchmark arm: the model shape, the data, the matmul ceiling, the measurement.

Every arm trains the same model (Mistral architecture, random init) on the same token rows for the
same number of optimizer steps; throughput is measured over the steps after `warmup`, in REAL
(unpadded) tokens per second, with CUDA synchronised at each step boundary.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

# The model: about 0.89 B parameters.
MODEL = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
             num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=4096, sliding_window=None)
# A CPU-sized stand-in with the same code path, for shaking out the harness.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, sliding_window=None)

# 70% lognormal around 350 tokens (sigma 0.5), 30% around 1800 (sigma 0.4), clipped to 16..4096.
MIXTURE = [(0.7, 350.0, 0.5), (0.3, 1800.0, 0.4)]
MIN_LEN, MAX_LEN = 16, 4096


def bimodal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    comp = rng.choice(len(MIXTURE), size=n, p=[w for w, _, _ in MIXTURE])
    med = np.array([m for _, m, _ in MIXTURE])[comp]
    sig = np.array([s for _, _, s in MIXTURE])[comp]
    return np.clip(np.round(med * np.exp(sig * rng.standard_normal(n))), MIN_LEN, MAX_LEN).astype(np.int64)


def token_rows(lengths: np.ndarray, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(3, vocab, size=int(n), dtype=np.int64) for n in lengths]


def matmul_ceiling_tflops(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """bf16 dense GEMM throughput on this device, measured now (the MFU denominator)."""
    if device.type != "cuda":
        return float("nan")
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - t) / 1e12


def flops_per_token(cfg: dict, mean_len: float) -> float:
    """Model FLOPs per token, training (fwd + bwd): 6N over non-embedding matmul weights plus the LM
    head, plus causal attention 6 * n_layers * hidden * mean_len (QK^T and AV, halved by causality)."""
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = h * cfg["num_key_value_heads"] // cfg["num_attention_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i
    n = L * per_layer + h * v
    return 6 * n + 6 * L * h * mean_len


@dataclass
class ArmResult:
    arm: str
    steps_measured: int
    real_tokens_per_s: float
    tokens_per_s: float
    padding_waste: float
    peak_mem_gib: float
    mfu: float
    tflops: float
    notes: str = ""

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))


def summarise(arm: str, step_times: list[float], real: list[int], padded: list[int], warmup: int,
              ceiling: float, cfg: dict, mean_len: float, notes: str = "") -> ArmResult:
    t = sum(step_times[warmup:])
    r, p = sum(real[warmup:]), sum(padded[warmup:])
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    tflops = r / t * flops_per_token(cfg, mean_len) / 1e12
    return ArmResult(arm=arm, steps_measured=len(step_times) - warmup, real_tokens_per_s=r / t, tokens_per_s=p / t,
                     padding_waste=1 - r / p if p else 0.0, peak_mem_gib=peak, mfu=tflops / ceiling, tflops=tflops,
                     notes=notes)
