"""The reference arms: not align runs, so they live here as code. Each builds the model of an align
bench experiment (the same transformers config align builds) and measures the reference loop:

  hf_padded       HF Trainer, right-padded batches of 8 bimodal rows (attention mask on padding)
  hf_flatten      HF Trainer + DataCollatorWithFlattening (padding-free, position ids)
  hf_ceiling      HF Trainer, 8 rows of exactly 2048 tokens: no padding, no mask
  hf_moe_fwd_bwd  transformers' own model, bf16, default experts kernel, 4 x 2048 tokens,
                  forward+backward only: no optimizer, no data, no logging
  hf_peft_gemma4  HF Trainer + PEFT LoRA on Gemma-4 26B-A4B (bench/base_gemma4_lora's model, bf16
                  weights on the GPU, the same LoRA targets and rank), padding-free
                  (DataCollatorWithFlattening), gradient checkpointing, each step the bench rows in
                  order up to the experiment's token budget (align's tokens per step)

    python bench/hf_arm.py --arm hf_padded --steps 30 --warmup 8 --rows-file rows.jsonl --out m.json [--tiny]

Writes the raw measurement (bench.common.measurement) to --out; bench/run.py derives rates and MFU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (  # noqa: E402
    experiment_config,
    hf_config,
    lora_model,
    measurement,
    model_class,
    read_rows,
    token_rows,
    useful_flops_per_token,
)

# reference arm -> the align experiment whose model it builds
REFERENCE_ARMS = {"hf_padded": "bench/base_dense", "hf_flatten": "bench/base_dense", "hf_ceiling": "bench/base_dense",
                  "hf_moe_fwd_bwd": "bench/base_moe", "hf_peft_gemma4": "bench/base_gemma4_lora"}
DATA_FILE, DATA_FLAG = "rows.jsonl", "--rows-file"
"""The harness's file these arms read (the ceiling and fwd+bwd arms make their own rows), and its flag."""
ROWS_PER_STEP = 8
CEILING_WIDTH = 2048
FWD_BWD_SHAPE, FWD_BWD_SHAPE_TINY = (4, 2048), (4, 128)


def reference_config(arm: str, tiny: bool):
    """The typed config of the arm's experiment (tiny: its CPU-sized preset)."""
    return experiment_config(REFERENCE_ARMS[arm], tiny)


def device_of(typed) -> torch.device:
    if typed.trainer.device.value == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


class RowsDataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i].tolist()}


def budget_groups(rows, budget: int, steps: int) -> list[list]:
    """The rows in order, cut into steps of at most `budget` tokens (a row longer than the budget
    alone): the tokens per step of align's token-budget sampler, without its length sort."""
    groups, cur, n = [], [], 0
    for r in rows:
        if cur and n + len(r) > budget:
            groups.append(cur)
            cur, n = [], 0
            if len(groups) == steps:
                break
        cur.append(r)
        n += len(r)
    return groups


class GroupsDataset(torch.utils.data.Dataset):
    """One item per step: a group of rows (the collator flattens the group)."""

    def __init__(self, groups):
        self.groups = groups

    def __len__(self):
        return len(self.groups)

    def __getitem__(self, i):
        return {"rows": [{"input_ids": r.tolist()} for r in self.groups[i]]}


def ungroup(collate):
    return lambda items: collate([f for item in items for f in item["rows"]])


class Counting:
    """Wraps a collator and records, per batch it builds in order: real tokens, tokens as shaped
    (padding included) and the model FLOPs of that shape (a packed batch per document, as align counts)."""

    def __init__(self, fn, flops, packed: bool):
        self.fn, self.flops, self.packed = fn, flops, packed
        self.real, self.padded, self.counted = [], [], []

    def __call__(self, features):
        batch = self.fn(features)
        lengths = [len(f["input_ids"]) for f in features]
        self.real.append(sum(lengths))
        self.padded.append(int(batch["input_ids"].numel()))
        shaped = sum(self.flops.per_batch(1, n) for n in lengths) if self.packed else \
            self.flops.per_batch(*batch["input_ids"].shape)
        self.counted.append(shaped)
        return batch


def right_pad(features, pad_id=0):
    """Right padding to the longest row with an attention mask, labels -100 on padding."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width), pad_id, dtype=torch.long)
    labels = torch.full((len(features), width), -100, dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for b, f in enumerate(features):
        n = len(f["input_ids"])
        ids[b, :n] = torch.tensor(f["input_ids"])
        labels[b, :n] = ids[b, :n]
        mask[b, :n] = 1
    out = {"input_ids": ids, "labels": labels}
    if not bool(mask.all()):
        out["attention_mask"] = mask
    return out


def trainer_arm(arm: str, typed, rows_file: Path, steps: int, warmup: int) -> dict:
    """HF Trainer over the bench rows (or ceiling rows), fp32 weights under bf16 autocast, fused AdamW,
    clip 1.0, constant lr (align's arms decay it on a cosine; a schedule does not change step time)."""
    from transformers import DataCollatorWithFlattening, Trainer, TrainerCallback, TrainingArguments

    from align.core.signatures import check_kwargs
    from align.telemetry.throughput import ModelFlops

    config = hf_config(typed)
    device = device_of(typed)
    n_rows = steps * ROWS_PER_STEP
    peft = arm == "hf_peft_gemma4"
    if arm == "hf_ceiling":
        rows = token_rows(np.full(n_rows, CEILING_WIDTH, dtype=np.int64), config.vocab_size)
    elif peft:
        groups = budget_groups(read_rows(rows_file), typed.sampler.max_tokens, steps)
        rows = [r for g in groups for r in g]
    else:
        rows = read_rows(rows_file)[:n_rows]
    torch.manual_seed(typed.trainer.seed)
    if peft:  # 25 B parameters: bf16, created on the GPU, as align's arm
        with torch.device(device):
            model = model_class(typed)._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
        model = lora_model(model, typed)
    else:
        model = model_class(typed)._from_config(config, attn_implementation="sdpa")
    flops = ModelFlops.from_model(model)
    flatten = arm in ("hf_flatten", "hf_peft_gemma4")
    collator = Counting(DataCollatorWithFlattening(return_position_ids=True) if flatten else right_pad, flops, flatten)
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        targs = dict(output_dir=tmp, per_device_train_batch_size=ROWS_PER_STEP, max_steps=steps,
                     learning_rate=typed.optimizer.lr, lr_scheduler_type="constant", warmup_steps=0, bf16=cuda,
                     optim="adamw_torch_fused" if cuda else "adamw_torch", save_strategy="no", report_to=[],
                     logging_steps=10_000, remove_unused_columns=False, max_grad_norm=typed.optimizer.max_grad_norm,
                     use_cpu=not cuda)
        if peft:
            targs.update(per_device_train_batch_size=1, gradient_checkpointing=True,
                         gradient_checkpointing_kwargs={"use_reentrant": False})
        check_kwargs(TrainingArguments.__init__, targs, "bench.hf_arm TrainingArguments")
        data = GroupsDataset(groups) if peft else RowsDataset(rows)
        trainer = Trainer(model=model, args=TrainingArguments(**targs), train_dataset=data,
                          data_collator=ungroup(collator) if peft else collator, callbacks=[StepClock()])
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    n, w = len(times), warmup
    real = sum(collator.real[w:n])
    fpt = useful_flops_per_token(flops, np.array([len(r) for r in rows]))
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return measurement(arm, times[-1] - times[w - 1], n - w, real, sum(collator.padded[w:n]),
                       sum(collator.counted[w:n]), real * fpt, peak, attn=model.config._attn_implementation)


def fwd_bwd_arm(arm: str, typed, steps: int, warmup: int) -> dict:
    """transformers' model alone in bf16: forward+backward of one fixed batch, no optimizer step."""
    from align.telemetry.throughput import ModelFlops

    config = hf_config(typed)
    dev = device_of(typed)
    rows, width = FWD_BWD_SHAPE_TINY if typed.model.preset.value == "tiny" else FWD_BWD_SHAPE
    with dev:
        model = model_class(typed)._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    model.train()
    x = torch.randint(3, config.vocab_size, (rows, width), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        sync()
        t = time.perf_counter()
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t)
    n = steps - warmup
    flops = ModelFlops.from_model(model).per_batch(rows, width) * n
    return measurement(arm, sum(times[warmup:]), n, rows * width * n, rows * width * n, flops, flops,
                       torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
                       attn=model.config._attn_implementation,
                       experts=getattr(model.config, "_experts_implementation", None))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", required=True, choices=sorted(REFERENCE_ARMS))
    ap.add_argument("--steps", type=int, default=30, help="steps in all, the warm-up included")
    ap.add_argument("--warmup", type=int, default=8, help="first steps not measured")
    ap.add_argument("--tiny", action="store_true", help="the experiment's tiny preset on the CPU: measures nothing")
    ap.add_argument("--rows-file", type=Path, help="the bimodal token rows every arm draws from (Trainer arms)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    typed = reference_config(a.arm, a.tiny)
    if a.arm == "hf_moe_fwd_bwd":
        m = fwd_bwd_arm(a.arm, typed, a.steps, a.warmup)
    else:
        if a.rows_file is None:
            raise SystemExit(f"bench/hf_arm.py: --arm {a.arm} needs --rows-file")
        m = trainer_arm(a.arm, typed, a.rows_file, a.steps, a.warmup)
    a.out.write_text(json.dumps(m, indent=1))
    print(json.dumps(m))


if __name__ == "__main__":
    main()
