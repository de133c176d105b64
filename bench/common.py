"""What every benchmark arm shares: the data, the model an experiment builds, the FLOPs convention and
the one place rates and MFU are derived from raw measurements.

Every arm draws from the same bimodal length distribution (token rows written once per command) and
is measured over the steps after its warm-up, between step boundaries with CUDA synchronised.

Two MFU columns, both over the bf16 matmul ceiling measured once per command:
- useful MFU: model FLOPs of the REAL tokens, each row at its own length (align.telemetry.throughput's
  convention: 4N on active parameters for the forward and the input-gradient backward, 2N more on the
  trainable ones for their weight gradients, plus attention over the full square). A full-parameter arm
  counts 6N; a LoRA arm counts 4N on its frozen base plus 6N on its adapters, as the model it trains.
  Padding earns nothing, and every arm is counted alike.
- counted MFU: the FLOPs of the batches as they were shaped (padding included), as align counts them
  per micro-batch in history.jsonl.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "conf" / "experiment" / "bench"

# 70% lognormal around 350 tokens (sigma 0.5), 30% around 1800 (sigma 0.4), clipped to 16..4096.
MIXTURE = [(0.7, 350.0, 0.5), (0.3, 1800.0, 0.4)]
MIN_LEN, MAX_LEN = 16, 4096
FIRST_ID = 3  # ids below this are the tokenizers' special tokens


def bimodal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    comp = rng.choice(len(MIXTURE), size=n, p=[w for w, _, _ in MIXTURE])
    med = np.array([m for _, m, _ in MIXTURE])[comp]
    sig = np.array([s for _, _, s in MIXTURE])[comp]
    return np.clip(np.round(med * np.exp(sig * rng.standard_normal(n))), MIN_LEN, MAX_LEN).astype(np.int64)


def token_rows(lengths: np.ndarray, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(FIRST_ID, vocab, size=int(n), dtype=np.int64) for n in lengths]


def write_rows(path: Path, rows: list[np.ndarray]) -> None:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps({"input_ids": r.tolist()}) + "\n")


def read_rows(path: Path) -> list[np.ndarray]:
    with path.open() as f:
        return [np.asarray(json.loads(line)["input_ids"], dtype=np.int64) for line in f]


# ------------------------------------------------------------------------------------ experiments


def experiment_names() -> list[str]:
    """The align arms: every config under conf/experiment/bench/ (`experiment=bench/<name>`)."""
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def compose_typed(overrides: Sequence[str]):
    """The typed train config of `overrides`, composed as `python -m align.train` would."""
    from align.config import to_typed
    from align.run.cli import compose

    return to_typed(compose(list(overrides)))


def tiny_overrides(typed) -> list[str]:
    """Overrides that turn an experiment (its typed config) into its family's CPU-sized `tiny` preset on
    the CPU: they drop the experiment's model-shape overrides (a null one stays: Hydra cannot delete a
    null), so the harness's code path runs but nothing is measured."""
    drop = [f"~model.overrides.{k}" for k, v in typed.model.overrides.items() if v is not None]
    rollout = TINY_ROLLOUT.get(typed.objective.kind, [])
    return ["model.preset=tiny", *drop, "trainer.device=cpu", *rollout]


TINY_GRPO = ["objective.prompts_per_rollout=4", "objective.group_size=4", "objective.max_new_tokens=16",
             "trainer.grad_accum=2", "objective.generation_batch_size=8"]
"""A GRPO experiment's tiny rollout: 4 prompts x 4 completions of 16 tokens, two micro-batches, two engine
calls (align's arms and TRL's read the same preset)."""
TINY_DISTILL = ["objective.prompts_per_rollout=16", "objective.max_new_tokens=16", "trainer.grad_accum=2",
                "objective.generation_batch_size=8"]
"""A distillation experiment's tiny rollout: GRPO's 16 completions of 16 tokens as 16 prompts x its own
group_size of 1, two micro-batches, two engine calls (align's arms and TRL's GKD arm read the same preset)."""
TINY_ROLLOUT = {"grpo": TINY_GRPO, "distill": TINY_DISTILL}


def experiment_config(experiment: str, tiny: bool = False):
    """The typed config of `experiment=<experiment>` (tiny: its family's CPU-sized preset)."""
    typed = compose_typed([f"experiment={experiment}"])
    return compose_typed([f"experiment={experiment}", *tiny_overrides(typed)]) if tiny else typed


def hf_config(typed):
    """The transformers config align builds for this typed config (its own tokenizer's special ids)."""
    from align.data.tokenizer import load_tokenizer
    from align.models.build import model_config

    return model_config(typed.model, load_tokenizer(typed.model))


def model_class(typed):
    from align.models.family import family_spec

    return family_spec(typed.model).classes()[1]


def model_flops(typed):
    """align's FLOPs counter over a meta-device build of the experiment's model (no memory, no init),
    under its scalar head for an objective that trains one (a reward model has no LM head to count),
    with the experiment's LoRA adapters when it has them: a frozen base earns no weight gradients."""
    from align.models.family import family_spec
    from align.models.scalar_head import to_scalar_head
    from align.telemetry.throughput import ModelFlops

    config = hf_config(typed)
    with torch.device("meta"):
        model = model_class(typed)._from_config(config)
        if type(typed.objective).scalar_head:
            model = to_scalar_head(model, family_spec(typed.model), config.pad_token_id)
        if typed.model.lora.enabled:
            model = lora_model(model, typed)
    return ModelFlops.from_model(model)


def lora_model(model, typed):
    """PEFT LoRA on the targets align adapts, with the experiment's rank, alpha and dropout."""
    from peft import LoraConfig, get_peft_model

    from align.core.signatures import check_kwargs
    from align.models.lora import discover_targets, lora_kwargs

    kw = lora_kwargs(typed.model.lora, discover_targets(model, typed.model.lora.target_modules))
    check_kwargs(LoraConfig.__init__, kw, "bench LoraConfig")
    return get_peft_model(model, LoraConfig(**kw))


def useful_flops_per_token(flops, lengths: np.ndarray) -> float:
    """Model FLOPs per real token when every row is computed at its own length."""
    return float(sum(flops.per_batch(1, int(n)) for n in lengths) / lengths.sum())


def matmul_ceiling_tflops() -> Optional[float]:
    from align.telemetry.throughput import measure_matmul_ceiling

    if not torch.cuda.is_available():
        return None
    return measure_matmul_ceiling(torch.device("cuda")).tflops


# ------------------------------------------------------------------------------------ measurement


def measurement(arm: str, seconds: float, steps: int, real_tokens: float, tokens: float, counted_flops: Optional[float],
                useful_flops: float, peak_mem_gib: Optional[float], **extra: Any) -> dict[str, Any]:
    """The raw numbers of one arm over its measured steps (per GPU for a several-GPU arm)."""
    return dict(arm=arm, seconds=seconds, steps_measured=steps, real_tokens=real_tokens, tokens=tokens,
                counted_flops=counted_flops, useful_flops=useful_flops, peak_mem_gib=peak_mem_gib, **extra)


def grpo_measurement(arm: str, step_s: Sequence[float], generation_s: Sequence[float], rollout_s: Sequence[float],
                     counts: Sequence[dict[str, int]], peak_mem_gib: Optional[float], **extra: Any) -> dict[str, Any]:
    """The raw numbers of a GRPO arm over its measured steps (one rollout each): wall seconds per step,
    generation and rollout-phase (generation, scoring, weight sync, extra log-prob passes) seconds, and
    per rollout its completions (`samples`), completion and prompt tokens and EOS stops."""
    total = {k: sum(c[k] for c in counts) for k in ("samples", "completion_tokens", "prompt_tokens", "stopped")}
    real = total["completion_tokens"] + total["prompt_tokens"]
    return dict(measurement(arm, float(sum(step_s)), len(step_s), real, real, None, None, peak_mem_gib),
                generation_s=float(sum(generation_s)), rollout_s=float(sum(rollout_s)), **total,
                step_ms=[round(s * 1000) for s in step_s], **extra)


def grpo_rates(m: dict[str, Any]) -> dict[str, Any]:
    """samples/s (completions per second of the whole step), the generation share of the step, rollout
    tokens/s (completion tokens per second of generation), update tokens/s (prompt + completion tokens
    per second of the step outside the rollout phase), mean completion length and EOS-stop fraction."""
    sec, update = m["seconds"], m["seconds"] - m["rollout_s"]
    n = m["samples"]
    return {"samples_per_s": n / sec, "generation_share": m["generation_s"] / sec,
            "rollout_tokens_per_s": _ratio(m["completion_tokens"], m["generation_s"]),
            "update_tokens_per_s": _ratio(m["real_tokens"], update if update > 0 else None),
            "completion_len_mean": m["completion_tokens"] / n if n else None,
            "stop_frac": m["stopped"] / n if n else None}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def summarise(m: dict[str, Any], ceiling_tflops: Optional[float]) -> dict[str, Any]:
    """Rates (pairs/s too when the measurement counts pairs: a DPO or reward-model arm; examples/s when it
    counts unpaired examples: a KTO arm), padding waste and both MFUs of a measurement, against the
    command's matmul ceiling."""
    sec = m["seconds"]
    useful_tflops = m["useful_flops"] / sec / 1e12 if m.get("useful_flops") is not None else None
    counted_tflops = m["counted_flops"] / sec / 1e12 if m.get("counted_flops") is not None else None
    pairs, examples = m.get("pairs"), m.get("examples")
    return {**m, "real_tokens_per_s": m["real_tokens"] / sec, "tokens_per_s": m["tokens"] / sec,
            "pairs_per_s": pairs / sec if pairs is not None else None,
            "examples_per_s": examples / sec if examples is not None else None,
            "tokens_per_step": m["tokens"] / m["steps_measured"],
            "padding_waste": 1 - m["real_tokens"] / m["tokens"] if m["tokens"] else 0.0,
            "useful_tflops": useful_tflops, "useful_mfu": _ratio(useful_tflops, ceiling_tflops),
            "counted_tflops": counted_tflops, "counted_mfu": _ratio(counted_tflops, ceiling_tflops),
            **(grpo_rates(m) if m.get("samples") is not None else {})}


def rate_key(r: dict[str, Any], base: dict[str, Any]) -> str:
    """What a ratio of two arms compares: samples/s when both count completions (GRPO and distillation
    arms), pairs/s when both count pairs (DPO and reward-model arms), examples/s when both count unpaired
    examples (KTO arms), else real tokens/s."""
    for key in ("samples_per_s", "pairs_per_s", "examples_per_s"):
        if r.get(key) is not None and base.get(key) is not None:
            return key
    return "real_tokens_per_s"


def add_ratios(results: list[dict[str, Any]], baselines: Sequence[str]) -> None:
    """`vs_<baseline>`: each arm's rate (`rate_key`) over a baseline arm's from the same command."""
    by = {r["arm"]: r for r in results if "error" not in r}
    for r in results:
        for b in baselines:
            base = by.get(b)
            r[f"vs_{b}"] = _ratio(r.get(rate_key(r, base)), base[rate_key(r, base)]) if base and "error" not in r \
                else None
