"""The HF Trainer arms: (1) right-padded batches, (2) DataCollatorWithFlattening (padding-free),
(3) the ceiling: rows of exactly 2048 tokens, no padding, no mask.

    python bench/hf_arm.py --arm hf_padded --steps 40 --warmup 8 --out result.json [--tiny]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (MODEL, TINY, matmul_ceiling_tflops, read_rows, summarise, token_rows,  # noqa: E402
                          useful_flops_per_token)


class RowsDataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i].tolist()}


class Counting:
    """Wraps a collator and records (real, padded) tokens of every batch it builds, in order."""

    def __init__(self, fn):
        self.fn, self.real, self.padded = fn, [], []

    def __call__(self, features):
        batch = self.fn(features)
        real = sum(len(f["input_ids"]) for f in features)
        self.real.append(real)
        self.padded.append(int(batch["input_ids"].numel()))
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", required=True, choices=["hf_padded", "hf_flatten", "hf_ceiling"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows-file", type=Path, required=True, help="the bimodal token rows every arm draws from")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    from transformers import (DataCollatorWithFlattening, MistralConfig, MistralForCausalLM, Trainer,
                              TrainerCallback, TrainingArguments)

    from align.preflight import check_kwargs

    cfg = TINY if a.tiny else MODEL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ceiling = matmul_ceiling_tflops()
    n_rows = a.steps * a.rows
    if a.arm == "hf_ceiling":
        rows = token_rows(np.full(n_rows, 2048, dtype=np.int64), cfg["vocab_size"])
    else:
        rows = read_rows(a.rows_file)[:n_rows]
    collator = Counting(DataCollatorWithFlattening(return_position_ids=True) if a.arm == "hf_flatten" else right_pad)

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**cfg, attn_implementation="sdpa"))
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        targs = dict(output_dir=tmp, per_device_train_batch_size=a.rows, max_steps=a.steps, learning_rate=1e-4,
                     lr_scheduler_type="constant", warmup_steps=0, bf16=device.type == "cuda",
                     optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch", save_strategy="no",
                     report_to=[], logging_steps=10_000, remove_unused_columns=False, max_grad_norm=1.0,
                     use_cpu=device.type != "cuda")
        check_kwargs(TrainingArguments.__init__, targs, "bench.hf_arm TrainingArguments")
        trainer = Trainer(model=model, args=TrainingArguments(**targs), train_dataset=RowsDataset(rows),
                          data_collator=collator, callbacks=[StepClock()])
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    n = len(times)
    w = a.warmup
    lengths = np.array([len(r) for r in rows])
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    res = summarise(a.arm, times[-1] - times[w - 1], sum(collator.real[w:n]), sum(collator.padded[w:n]), n - w, peak,
                    useful_flops_per_token(cfg, lengths), ceiling, notes=f"attn={model.config._attn_implementation}")
    res.dump(a.out)
    print(res)


if __name__ == "__main__":
    main()
