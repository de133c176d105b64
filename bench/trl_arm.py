"""TRL's DPOTrainer as the DPO bench's reference arms: not align runs, so they live here as code. Each
builds the policy exactly as align builds it for the DPO bench experiment (bench/base_dpo: the same
transformers config, the same seed, align.models.build_model) and trains it on the bench pairs
(bench/pairs.py), 8 pairs per optimizer step:

  trl_dpo_ref          DPOTrainer with a reference copy (`ref_model=` a deep copy of the starting policy)
  trl_dpo_precomputed  DPOTrainer with `precompute_ref_log_probs=True`: the reference log-probs of the
                       whole train set in one pass inside DPOTrainer's constructor (not timed), no
                       reference model during training
  trl_dpo_ref_ckpt     trl_dpo_ref with TRL's own default `gradient_checkpointing=True`

    python bench/trl_arm.py --arm trl_dpo_ref --steps 20 --warmup 5 --pairs-file pairs.jsonl --out m.json [--tiny]

TRL settings (DPOConfig, checked by name against the installed signature before the trainer is built):
- bf16=True over the fp32 policy (autocast, fp32 master weights), optim=adamw_torch_fused, clip and lr
  from the experiment, constant schedule, no warm-up: the align arms' optimizer;
- gradient_checkpointing=False except in trl_dpo_ref_ckpt: DPOConfig defaults it to True (TRL's
  _BaseConfig), and no align arm recomputes activations, so the comparison is recompute-free;
- padding_free left False: TRL 1.16's DPOTrainer warns and falls back to padding when it is set
  (its docstring: "Temporarily unavailable: since the DPO refactor"); its collator right-pads the
  16 sequences of 8 pairs with an attention mask (SDPA, the attention align resolves);
- max_length = the experiment's data.max_seq_len, which no bench pair reaches (no truncation);
- the pairs in TRL's conversational form, so its chat-template tokenization gives the tokens align's
  encoder gives (the arm checks it pair by pair: `tokens_match_align`).

Writes the raw measurement (bench.common.measurement, plus pairs) to --out; bench/run.py derives the rates.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import experiment_config, measurement, useful_flops_per_token  # noqa: E402


@dataclass(frozen=True)
class TrlArm:
    precompute: bool
    """precompute_ref_log_probs: the reference's log-probs computed once before training."""
    checkpointing: bool
    """gradient_checkpointing (TRL's default is True)."""


ARMS = {"trl_dpo_ref": TrlArm(precompute=False, checkpointing=False),
        "trl_dpo_precomputed": TrlArm(precompute=True, checkpointing=False),
        "trl_dpo_ref_ckpt": TrlArm(precompute=False, checkpointing=True)}
EXPERIMENT = "bench/base_dpo"
REFERENCE_ARMS = {arm: EXPERIMENT for arm in ARMS}
"""reference arm -> the align experiment whose model (and pair data) it uses."""
DATA_FILE, DATA_FLAG = "pairs.jsonl", "--pairs-file"
PAIRS_PER_STEP = 8


def device_of(typed) -> torch.device:
    if typed.trainer.device.value == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def dpo_config_kwargs(arm: str, typed, output_dir: str, steps: int, cuda: bool) -> dict[str, Any]:
    """DPOConfig's kwargs for `arm` (module doc: which settings and why)."""
    spec = ARMS[arm]
    return dict(output_dir=output_dir, per_device_train_batch_size=PAIRS_PER_STEP, gradient_accumulation_steps=1,
                max_steps=steps, learning_rate=typed.optimizer.lr, lr_scheduler_type="constant", warmup_steps=0,
                max_grad_norm=typed.optimizer.max_grad_norm, bf16=cuda, use_cpu=not cuda,
                optim="adamw_torch_fused" if cuda else "adamw_torch", gradient_checkpointing=spec.checkpointing,
                precompute_ref_log_probs=spec.precompute, padding_free=False, max_length=typed.data.max_seq_len,
                beta=typed.objective.beta, loss_type=[typed.objective.loss], seed=typed.trainer.seed,
                save_strategy="no", report_to=[], logging_steps=10_000, dataloader_num_workers=0, disable_dropout=True)


def conversational(pair: dict[str, str]) -> dict[str, list[dict[str, str]]]:
    """A bench pair as TRL's conversational preference example (one user turn, one assistant turn)."""
    return {"prompt": [{"role": "user", "content": pair["prompt"]}],
            "chosen": [{"role": "assistant", "content": pair["chosen"]}],
            "rejected": [{"role": "assistant", "content": pair["rejected"]}]}


class Counting:
    """Wraps a TRL collator; records per batch, in order: real tokens (attention masks), tokens as shaped
    (padding included) and the model FLOPs of those shapes, over the batch's sequences and, for KTO, its
    KL sequences (`KL_` keys). bench/trl_objectives.py's arms count with it too."""

    def __init__(self, fn, flops) -> None:
        self.fn, self.flops = fn, flops
        self.real: list[int] = []
        self.padded: list[int] = []
        self.counted: list[float] = []

    def __call__(self, examples):
        batch = self.fn(examples)
        keys = [p for p in ("", "KL_") if f"{p}input_ids" in batch]
        self.real.append(sum(int(batch[f"{p}attention_mask"].sum()) for p in keys))
        self.padded.append(sum(int(batch[f"{p}input_ids"].numel()) for p in keys))
        self.counted.append(sum(self.flops.per_batch(*batch[f"{p}input_ids"].shape) for p in keys))
        return batch

    def clear(self) -> None:
        """Forget the batches the precompute pass collated (TRL runs it through the same collator)."""
        self.real.clear(), self.padded.clear(), self.counted.clear()


def tokens_match(train_dataset, pairs: list[dict[str, str]], tokenizer) -> bool:
    """Every pair TRL tokenized is, side by side, the token sequence align's encoder builds."""
    from bench.pairs import encoded_sides

    for ex, (_, chosen, rejected) in zip(train_dataset, encoded_sides(pairs, tokenizer)):
        if ex["prompt_ids"] + ex["chosen_ids"] != chosen or ex["prompt_ids"] + ex["rejected_ids"] != rejected:
            return False
    return True


def build_policy(typed, tokenizer, device: torch.device):
    """The experiment's model as align builds it (seeded like align's trainer), on the host."""
    from align.models import build_model

    torch.manual_seed(typed.trainer.seed)
    return build_model(typed.model, typed.attention, tokenizer, device).model


def dpo_arm(arm: str, typed, pairs_file: Path, steps: int, warmup: int) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    from align.core.signatures import check_kwargs
    from align.data.tokenizer import load_tokenizer
    from align.objectives.reference import weights_sha256
    from align.telemetry.throughput import ModelFlops

    device = device_of(typed)
    cuda = device.type == "cuda"
    pairs = [json.loads(line) for line in pairs_file.read_text().splitlines() if line.strip()][:steps * PAIRS_PER_STEP]
    if len(pairs) < steps * PAIRS_PER_STEP:
        raise SystemExit(f"bench/trl_arm.py: {pairs_file} holds {len(pairs)} pairs; {steps} steps of "
                         f"{PAIRS_PER_STEP} need {steps * PAIRS_PER_STEP}")
    tokenizer = load_tokenizer(typed.model)
    model = build_policy(typed, tokenizer, device)
    sha = weights_sha256(model)
    flops = ModelFlops.from_model(model)
    spec = ARMS[arm]
    ref_model = None if spec.precompute else copy.deepcopy(model)
    collator = Counting(DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id,
                                                  max_length=typed.data.max_seq_len), flops)
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        kwargs = dpo_config_kwargs(arm, typed, tmp, steps, cuda)
        check_kwargs(DPOConfig.__init__, kwargs, "bench.trl_arm DPOConfig")
        trainer_kwargs = dict(model=model, ref_model=ref_model, args=DPOConfig(**kwargs), data_collator=collator,
                              train_dataset=Dataset.from_list([conversational(p) for p in pairs]),
                              processing_class=tokenizer, callbacks=[StepClock()])
        check_kwargs(DPOTrainer.__init__, trainer_kwargs, "bench.trl_arm DPOTrainer")
        t0 = time.perf_counter()
        trainer = DPOTrainer(**trainer_kwargs)
        setup_s = time.perf_counter() - t0  # tokenization, and for precompute the reference pass
        collator.clear()
        match = tokens_match(trainer.train_dataset, pairs, tokenizer)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    n, w = len(times), warmup
    if n <= w:
        raise SystemExit(f"bench/trl_arm.py: {n} steps timed, not more than --warmup {w}")
    real = sum(collator.real[w:n])
    lengths = np.array([len(ex["prompt_ids"]) + len(ex[side]) for ex in trainer.train_dataset
                        for side in ("chosen_ids", "rejected_ids")])
    return measurement(arm, times[-1] - times[w - 1], n - w, real, sum(collator.padded[w:n]),
                       sum(collator.counted[w:n]), real * useful_flops_per_token(flops, lengths),
                       torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                       pairs=(n - w) * PAIRS_PER_STEP, attn=model.config._attn_implementation,
                       trl={**trl_settings(trainer.args), "trainer_padding_free": trainer.padding_free},
                       setup_s=round(setup_s, 2), tokens_match_align=match,
                       weights_sha256=sha, step_ms=[round((b - a) * 1000) for a, b in zip(times[w - 1:], times[w:])])


SETTINGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "optim", "gradient_checkpointing",
            "activation_checkpointing", "precompute_ref_log_probs", "padding_free", "max_length", "beta", "loss_type",
            "learning_rate", "max_grad_norm", "lr_scheduler_type")


def trl_settings(args) -> dict[str, Any]:
    """What the built DPOConfig resolved (transformers 5.24 mirrors gradient_checkpointing into
    activation_checkpointing), with the trainer's own padding_free after its fallback."""
    import trl

    return {"version": trl.__version__, **{k: _plain(getattr(args, k, None)) for k in SETTINGS}}


def _plain(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", required=True, choices=sorted(ARMS))
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps in all, the warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="first steps not measured")
    ap.add_argument("--tiny", action="store_true", help="the experiment's tiny preset on the CPU: measures nothing")
    ap.add_argument("--pairs-file", type=Path, required=True, help="the bench pairs (bench/pairs.py)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not 1 <= a.warmup < a.steps:
        raise SystemExit(f"bench/trl_arm.py: --warmup {a.warmup} must be >= 1 and below --steps {a.steps}")
    m = dpo_arm(a.arm, experiment_config(EXPERIMENT, a.tiny), a.pairs_file, a.steps, a.warmup)
    a.out.write_text(json.dumps(m, indent=1))
    print(json.dumps({k: v for k, v in m.items() if k != "step_ms"}))


if __name__ == "__main__":
    main()
