"""Shared by every benchmark arm: the model shape, the data, the FLOPs convention, the measurement.

Every arm trains the same model (Mistral architecture, random init, fp32 weights under bf16
autocast, fused AdamW, clip 1.0, constant lr) on token rows drawn from the same bimodal length
distribution, for a fixed number of optimizer steps. Throughput is measured over the steps after
`warmup`, in REAL (unpadded) tokens per second, between step boundaries with CUDA synchronised.

MFU here is "useful" MFU: model FLOPs of the real tokens (align.telemetry.throughput's convention:
6N plus attention over each row's own length, full square) per second, over a bf16 matmul ceiling
measured in the same command. Padding therefore earns nothing, and every arm is counted alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

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


def write_rows(path: Path, rows: list[np.ndarray]) -> None:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps({"input_ids": r.tolist()}) + "\n")


def read_rows(path: Path) -> list[np.ndarray]:
    with path.open() as f:
        return [np.asarray(json.loads(line)["input_ids"], dtype=np.int64) for line in f]


def model_flops(cfg: dict):
    """align's FLOPs counter over a meta-device build of the bench model (no memory, no init)."""
    from transformers import MistralConfig, MistralForCausalLM

    from align.telemetry.throughput import ModelFlops

    with torch.device("meta"):
        model = MistralForCausalLM(MistralConfig(**cfg))
    return ModelFlops.from_model(model)


def useful_flops_per_token(cfg: dict, lengths: np.ndarray) -> float:
    """Model FLOPs per real token when every row is computed at its own length."""
    mf = model_flops(cfg)
    return float(sum(mf.per_batch(1, int(n)) for n in lengths) / lengths.sum())


def matmul_ceiling_tflops() -> float:
    from align.telemetry.throughput import measure_matmul_ceiling

    if not torch.cuda.is_available():
        return float("nan")
    return measure_matmul_ceiling(torch.device("cuda")).tflops


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


def summarise(arm: str, seconds: float, real: int, padded: int, steps: int, peak_gib: float,
              flops_per_token: float, ceiling: float, notes: str = "") -> ArmResult:
    tflops = real / seconds * flops_per_token / 1e12
    return ArmResult(arm=arm, steps_measured=steps, real_tokens_per_s=real / seconds, tokens_per_s=padded / seconds,
                     padding_waste=1 - real / padded if padded else 0.0, peak_mem_gib=peak_gib, mfu=tflops / ceiling,
                     tflops=tflops, notes=notes)


def parse_defines(defines: list[str]) -> dict[str, list[str]]:
    """`--define NAME='ov1 ov2 ...'`: an extra align arm from the command line (exploration without
    editing the arm table; a lever that wins moves into the table with its measurement)."""
    arms = {}
    for d in defines:
        name, sep, overrides = d.partition("=")
        if not sep or not name:
            raise SystemExit(f"--define: expected NAME='override override ...', got {d!r}")
        arms[name] = overrides.split()
    return arms


def profile_kernels(overrides: list[str], out: Path, name: str, env: dict, steps: int = 3) -> None:
    """The kernel table (align.probe probe=kernels) of an align arm's exact configuration, printed:
    where its step time goes on the device, and how much of the wall the kernels fill."""
    run_dir = out / f"kernels_{name}"
    cmd = [sys.executable, "-m", "align.probe", "probe=kernels", "probe.kernels.warmup=6",
           "probe.kernels.timed_steps=4", f"probe.kernels.steps={steps}",
           *[o for o in overrides if not o.startswith(("trainer.max_steps=", "hydra.run.dir="))],
           f"hydra.run.dir={run_dir}"]
    with (out / f"kernels_{name}.log").open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    report = run_dir / "kernels.md"
    print(f"---- kernels of {name} (exit {rc}) ----")
    print(report.read_text() if report.exists() else (out / f"kernels_{name}.log").read_text()[-3000:], flush=True)
