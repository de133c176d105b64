"""TRL's KTOTrainer, RewardTrainer and GKDTrainer as reference arms of bench/run.py (not align runs, so they
live here as code), each held against the align experiment that is its objective's default at the bench
shape:

  trl_kto     KTOTrainer (loss_type kto), a reference copy    vs bench/kto_default            examples/s
  trl_reward  RewardTrainer (Bradley-Terry)                  vs bench/reward_model_default   pairs/s
  trl_gkd     experimental GKDTrainer, lmbda=1 (on-policy)   vs bench/distill_default        completions/s

    python bench/trl_objectives.py --arm trl_kto --steps 20 --warmup 5 --pairs-file pairs.jsonl --out m.json [--tiny]
    python bench/trl_objectives.py --arm trl_gkd --steps 2 --warmup 1 --teacher teacher/ --out m.json [--tiny]

Every arm builds its model exactly as align builds it for its experiment (the same transformers config,
the same seed, align.models.build_model; the reward model under align's scalar head, the class
AutoModelForSequenceClassification maps the family to) and records its weights' sha256. Settings matched
as in the DPO arms (bench/trl_arm.py), every kwarg checked by name against the installed TRL before the
trainer is built: bf16=True over the fp32 model (autocast, fp32 master weights), optim=adamw_torch_fused,
the experiment's lr and clip, constant schedule, no warm-up, gradient_checkpointing=False (TRL's configs
default it to True; no align arm recomputes activations), max_length = the experiment's data.max_seq_len
(no bench pair or prompt reaches it), dropout off.

- trl_kto: the examples align's KTO reads from the pair file (align/data/unpaired.py `load_examples`: of
  the first N pairs, the N chosen completions as desirable, then the N rejected ones as undesirable),
  in TRL's conversational unpaired form, in that order (KTOTrainer samples sequentially: it needs to, for
  its KL completions); 8 examples per optimizer step (TRL's default per_device_train_batch_size), the
  experiment's beta and weights, a reference copy (ref_model= a deep copy of the starting policy; TRL's
  default precompute_ref_log_probs=False). The KL sequences differ by construction: TRL rotates the
  completions within each batch of 8, align over the whole data set (each example with the nearest one
  before it of another prompt); both pair a prompt with another prompt's completion. Checked per example:
  TRL's prompt + completion tokens are align's encoder's (`tokens_match_align`).
- trl_reward: the bench pairs in TRL's conversational form, 8 pairs per optimizer step, the experiment's
  center_rewards_coefficient; TRL's tokens of both sides checked pair by pair against align's encoder.
- trl_gkd: the student samples every micro-batch's completions itself (lmbda=1: on-policy, seq_kd off)
  with `model.generate` (GKDTrainer has no other backend) and a frozen teacher scores them: the teacher
  bench/run.py wrote, loaded by align's own loader (align/objectives/teacher.py). The divergence is
  align's: reverse_kl is TRL's generalised JSD at beta=1, loss=jsd its beta. The rollout is the
  experiment's: prompts_per_rollout completions per optimizer step in trainer.grad_accum micro-batches,
  max_new_tokens, temperature. GKDTrainer samples with top_k=0 and top_p=1, divides no logits by the
  temperature in its loss and draws one completion per prompt, so an experiment with top_p < 1, a
  temperature other than 1, group_size > 1 or several updates per rollout is refused, not compared. The
  prompts are the first ones align keeps (align.data.prompts.load_prompts), each with its reference as
  the placeholder assistant turn TRL's ChatML collator expects (replaced by the student's sample before
  any forward); TRL's prompt tokens are checked against align's. What differs and stays: GKDTrainer
  calls `generate` once per micro-batch (grad_accum calls of rollout / grad_accum rows) where align's
  engine generates the whole rollout in as few calls as its memory plan allows, and TRL's loss
  materialises both models' full logits.

Timed as bench/trl_arm.py and bench/trl_grpo.py do (a step-end callback, CUDA synchronised); trl_gkd also
times each `generate` call and each teacher forward (its rollout phase: align's distillation row counts
its teacher's forwards there too) and counts per step its completions, their tokens up to and including
the first EOS, the prompts' tokens and the EOS stops. Writes the raw measurement to --out; bench/run.py
derives the rates.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # trl.experimental's import warning: GKD is the arm
from bench.common import (  # noqa: E402
    compose_typed,
    experiment_config,
    grpo_measurement,
    measurement,
    tiny_overrides,
    useful_flops_per_token,
)
from bench.pairs import PAIRS_FILE  # noqa: E402
from bench.teacher import TEACHER_DIR  # noqa: E402
from bench.trl_arm import Counting, conversational, device_of  # noqa: E402

ARMS = {"trl_kto": "bench/kto_default", "trl_reward": "bench/reward_model_default",
        "trl_gkd": "bench/distill_default"}
REFERENCE_ARMS = dict(ARMS)
"""reference arm -> the align experiment whose model, data and objective settings it uses."""
DATA = {"trl_kto": (PAIRS_FILE, "--pairs-file"), "trl_reward": (PAIRS_FILE, "--pairs-file"),
        "trl_gkd": (TEACHER_DIR, "--teacher")}
"""reference arm -> (what bench/run.py writes for it under $OUT, the flag that passes it)."""
PER_STEP = 8
"""KTO examples, or reward-model pairs, per optimizer step: TRL's default per_device_train_batch_size."""


def pairs_needed(arm: str, steps: int) -> int:
    """Bench pairs `steps` steps of `arm` read: a KTO example is one side of a pair."""
    if arm == "trl_kto":
        return -(-steps * PER_STEP // 2)
    return steps * PER_STEP if arm == "trl_reward" else 0


def arm_config(arm: str, tiny: bool, teacher: Optional[Path] = None):
    """The typed config of the arm's experiment (tiny: its CPU preset), with the teacher bench/run.py wrote."""
    if teacher is None:
        return experiment_config(ARMS[arm], tiny)
    base = [f"experiment={ARMS[arm]}"]
    return compose_typed([*base, *(tiny_overrides(compose_typed(base)) if tiny else []),
                          f"objective.teacher={teacher}"])


# ------------------------------------------------------------------------------------- TRL's configs


def base_kwargs(typed, output_dir: str, steps: int, cuda: bool) -> dict[str, Any]:
    """What every arm's config sets alike (module doc)."""
    return dict(output_dir=output_dir, max_steps=steps, learning_rate=typed.optimizer.lr, lr_scheduler_type="constant",
                warmup_steps=0, max_grad_norm=typed.optimizer.max_grad_norm, bf16=cuda, use_cpu=not cuda,
                optim="adamw_torch_fused" if cuda else "adamw_torch", gradient_checkpointing=False,
                max_length=typed.data.max_seq_len, seed=typed.trainer.seed, save_strategy="no", report_to=[],
                logging_steps=10_000, dataloader_num_workers=0, disable_dropout=True)


def kto_config_kwargs(typed, output_dir: str, steps: int, cuda: bool) -> dict[str, Any]:
    o = typed.objective
    return dict(base_kwargs(typed, output_dir, steps, cuda), per_device_train_batch_size=PER_STEP,
                gradient_accumulation_steps=1, loss_type="kto", beta=o.beta, desirable_weight=o.desirable_weight,
                undesirable_weight=o.undesirable_weight, precompute_ref_log_probs=False)


def reward_config_kwargs(typed, output_dir: str, steps: int, cuda: bool) -> dict[str, Any]:
    return dict(base_kwargs(typed, output_dir, steps, cuda), per_device_train_batch_size=PER_STEP,
                gradient_accumulation_steps=1, center_rewards_coefficient=typed.objective.center_rewards_coefficient)


def gkd_beta(typed) -> float:
    """TRL's generalised-JSD beta of align's divergence: reverse KL is beta=1 (align/objectives/distill_loss.py)."""
    o = typed.objective
    return 1.0 if o.loss.value == "reverse_kl" else o.beta


def gkd_mismatch(typed) -> Optional[str]:
    """Why GKDTrainer cannot run the experiment's distillation (module doc), or None."""
    o = typed.objective
    if (o.group_size, o.updates_per_rollout) != (1, 1):
        return (f"objective.group_size={o.group_size}, objective.updates_per_rollout={o.updates_per_rollout}: "
                "GKDTrainer samples one completion per prompt and steps once per sample; accepted: 1 and 1")
    if o.top_p != 1.0 or o.temperature != 1.0:
        return (f"objective.top_p={o.top_p}, objective.temperature={o.temperature}: GKDTrainer samples with "
                "top_p=1 and leaves its loss's logits unscaled; accepted: 1.0 and 1.0")
    rollout, accum = o.prompts_per_rollout * o.group_size, typed.trainer.grad_accum
    if rollout % accum:
        return (f"{rollout} completions do not split into trainer.grad_accum={accum} equal micro-batches, "
                "GKDTrainer's per-device batch")
    return None


def gkd_config_kwargs(typed, output_dir: str, steps: int, cuda: bool) -> dict[str, Any]:
    o = typed.objective
    accum = typed.trainer.grad_accum
    return dict(base_kwargs(typed, output_dir, steps, cuda), per_device_train_batch_size=o.prompts_per_rollout // accum,
                gradient_accumulation_steps=accum, lmbda=1.0, seq_kd=False, beta=gkd_beta(typed),
                temperature=o.temperature, max_new_tokens=o.max_new_tokens)


def settings(args, names: tuple[str, ...]) -> dict[str, Any]:
    """What the built config resolved, and the TRL version."""
    import trl

    return {"version": trl.__version__, **{k: _plain(getattr(args, k, None)) for k in names}}


def _plain(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


COMMON = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "optim", "gradient_checkpointing",
          "max_length", "learning_rate", "max_grad_norm", "lr_scheduler_type")
SETTINGS = {"trl_kto": (*COMMON, "loss_type", "beta", "desirable_weight", "undesirable_weight",
                        "precompute_ref_log_probs", "train_sampling_strategy"),
            "trl_reward": (*COMMON, "center_rewards_coefficient"),
            "trl_gkd": (*COMMON, "lmbda", "seq_kd", "beta", "temperature", "max_new_tokens")}


# --------------------------------------------------------------------------------------- measuring


class Clock:
    """Step ends, and per step the seconds of generate calls and teacher forwards and the rollout counts."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.ends: list[float] = []
        self.generation: list[float] = []
        self.teacher: list[float] = []
        self.calls: list[int] = []
        self.counts: list[dict[str, int]] = []
        self._open()

    def _open(self) -> None:
        self.step = {"generation": 0.0, "teacher": 0.0, "calls": 0,
                     "counts": {"samples": 0, "completion_tokens": 0, "prompt_tokens": 0, "stopped": 0}}

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def close(self) -> None:
        """The optimizer step ended: its sums join the per-step lists."""
        self.ends.append(self.now())
        s = self.step
        self.generation.append(s["generation"]), self.teacher.append(s["teacher"]), self.calls.append(s["calls"])
        self.counts.append(s["counts"])
        self._open()


def step_clock(clock: Clock):
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            clock.close()

    return StepClock()


def build_student(typed, tokenizer, device: torch.device):
    """The experiment's model as align's trainer builds it (seeded alike; a scalar-head objective's under
    its head), on the host."""
    from align.models import build_model

    torch.manual_seed(typed.trainer.seed)
    return build_model(typed.model, typed.attention, tokenizer, device,
                       scalar_head=type(typed.objective).scalar_head).model


def read_pairs(path: Path, n: int) -> list[dict[str, str]]:
    pairs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    if len(pairs) < n:
        raise SystemExit(f"bench/trl_objectives.py: {path} holds {len(pairs)} pairs; the steps need {n}")
    return pairs


def window(clock: Clock, warmup: int, what: str) -> tuple[int, float]:
    """(measured steps, their seconds): the steps after the warm-up, boundary to boundary (`clock.ends`
    starts with the first step's start)."""
    n = len(clock.ends) - 1
    if n <= warmup:
        raise SystemExit(f"bench/trl_objectives.py: {n} {what} steps timed, not more than --warmup {warmup}")
    return n - warmup, clock.ends[-1] - clock.ends[warmup]


# ----------------------------------------------------------------------------------------- KTO


def kto_examples(typed, pairs_file: Path, n_pairs: int, tokenizer):
    """The examples align's KTO reads from the first `n_pairs` pairs of the file, in its order, and
    align's encoding of them (align/data/unpaired.py)."""
    from align.data.preference import BadRecords
    from align.data.unpaired import encode_examples, load_examples

    cfg = dataclasses.replace(typed.data, path=str(pairs_file), max_records=n_pairs)
    examples = load_examples(cfg, BadRecords(cfg.on_bad_record))
    return examples, encode_examples(examples, tokenizer, cfg, BadRecords(cfg.on_bad_record), workers=0)


def kto_tokens_match(train_dataset, encoded) -> bool:
    """Every example TRL tokenized is, prompt + completion, the sequence align's encoder builds for it."""
    for i, ex in enumerate(train_dataset):
        if ex["prompt_ids"] + ex["completion_ids"] != encoded.row(2 * i)[0].tolist():
            return False
    return True


def kto_arm(arm: str, typed, pairs_file: Path, steps: int, warmup: int) -> dict:
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    from align.core.signatures import check_kwargs
    from align.data.tokenizer import load_tokenizer
    from align.objectives.reference import weights_sha256
    from align.telemetry.throughput import ModelFlops

    device = device_of(typed)
    cuda = device.type == "cuda"
    tokenizer = load_tokenizer(typed.model)
    examples, encoded = kto_examples(typed, pairs_file, pairs_needed(arm, steps), tokenizer)
    examples = examples[:steps * PER_STEP]
    rows = [{"prompt": e.prompt, "completion": [e.completion], "label": e.label} for e in examples]
    model = build_student(typed, tokenizer, device)
    sha, flops = weights_sha256(model), ModelFlops.from_model(model)
    clock = Clock(cuda)
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = kto_config_kwargs(typed, tmp, steps, cuda)
        check_kwargs(KTOConfig.__init__, kwargs, "bench.trl_objectives KTOConfig")
        config = KTOConfig(**kwargs)
        collator = Counting(DataCollatorForUnpairedPreference(pad_token_id=tokenizer.pad_token_id,
                                                              max_length=config.max_length,
                                                              pad_to_multiple_of=config.pad_to_multiple_of), flops)
        trainer_kwargs = dict(model=model, ref_model=copy.deepcopy(model), args=config, data_collator=collator,
                              train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                              callbacks=[step_clock(clock)])
        check_kwargs(KTOTrainer.__init__, trainer_kwargs, "bench.trl_objectives KTOTrainer")
        t0 = time.perf_counter()
        trainer = KTOTrainer(**trainer_kwargs)
        setup_s = time.perf_counter() - t0
        match = kto_tokens_match(trainer.train_dataset, encoded)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        clock.ends.append(clock.now())  # the first step's start
        trainer.train()
    n, seconds = window(clock, warmup, "KTO")
    w = warmup
    real = sum(collator.real[w:w + n])
    lengths = np.array([len(ex["prompt_ids"]) + len(ex[k]) for ex in trainer.train_dataset
                        for k in ("completion_ids", "KL_completion_ids")])
    args = trainer.args
    return measurement(arm, seconds, n, real, sum(collator.padded[w:w + n]), sum(collator.counted[w:w + n]),
                       real * useful_flops_per_token(flops, lengths),
                       torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                       examples=n * PER_STEP, attn=model.config._attn_implementation,
                       trl=settings(args, SETTINGS[arm]), setup_s=round(setup_s, 2), tokens_match_align=match,
                       desirable=sum(e.label for e in examples), weights_sha256=sha,
                       setting=f"TRL {settings(args, ())['version']}, {args.per_device_train_batch_size} examples "
                               f"per step, a reference copy, precompute_ref_log_probs={args.precompute_ref_log_probs}, "
                               f"gradient_checkpointing={args.gradient_checkpointing}",
                       step_ms=_step_ms(clock, warmup))


def _step_ms(clock: Clock, warmup: int) -> list[int]:
    ends = clock.ends[warmup:]
    return [round((b - a) * 1000) for a, b in zip(ends[:-1], ends[1:])]


# -------------------------------------------------------------------------------------- reward


def reward_arm(arm: str, typed, pairs_file: Path, steps: int, warmup: int) -> dict:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    from align.core.signatures import check_kwargs
    from align.data.tokenizer import load_tokenizer
    from align.objectives.reference import weights_sha256
    from align.telemetry.throughput import ModelFlops
    from bench.pairs import encoded_sides

    device = device_of(typed)
    cuda = device.type == "cuda"
    tokenizer = load_tokenizer(typed.model)
    pairs = read_pairs(pairs_file, pairs_needed(arm, steps))
    model = build_student(typed, tokenizer, device)
    sha, flops = weights_sha256(model), ModelFlops.from_model(model)
    clock = Clock(cuda)
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = reward_config_kwargs(typed, tmp, steps, cuda)
        check_kwargs(RewardConfig.__init__, kwargs, "bench.trl_objectives RewardConfig")
        config = RewardConfig(**kwargs)
        collator = Counting(DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id,
                                                      pad_to_multiple_of=config.pad_to_multiple_of), flops)
        trainer_kwargs = dict(model=model, args=config, data_collator=collator,
                              train_dataset=Dataset.from_list([conversational(p) for p in pairs]),
                              processing_class=tokenizer, callbacks=[step_clock(clock)])
        check_kwargs(RewardTrainer.__init__, trainer_kwargs, "bench.trl_objectives RewardTrainer")
        t0 = time.perf_counter()
        trainer = RewardTrainer(**trainer_kwargs)
        setup_s = time.perf_counter() - t0
        match = len(trainer.train_dataset) == len(pairs) and all(
            ex["chosen_ids"] == chosen and ex["rejected_ids"] == rejected
            for ex, (_, chosen, rejected) in zip(trainer.train_dataset, encoded_sides(pairs, tokenizer)))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        clock.ends.append(clock.now())
        trainer.train()
    n, seconds = window(clock, warmup, "reward")
    w = warmup
    real = sum(collator.real[w:w + n])
    lengths = np.array([len(ex[k]) for ex in trainer.train_dataset for k in ("chosen_ids", "rejected_ids")])
    args = trainer.args
    return measurement(arm, seconds, n, real, sum(collator.padded[w:w + n]), sum(collator.counted[w:w + n]),
                       real * useful_flops_per_token(flops, lengths),
                       torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                       pairs=n * PER_STEP, attn=model.config._attn_implementation, trl=settings(args, SETTINGS[arm]),
                       setup_s=round(setup_s, 2), tokens_match_align=match, head=type(model).__name__,
                       weights_sha256=sha,
                       setting=f"TRL {settings(args, ())['version']}, {args.per_device_train_batch_size} pairs per "
                               f"step, {type(model).__name__}, gradient_checkpointing={args.gradient_checkpointing}",
                       step_ms=_step_ms(clock, warmup))


# ----------------------------------------------------------------------------------------- GKD


def gkd_examples(typed, tokenizer, n: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """The first `n` prompts align's distillation keeps (align.data.prompts.load_prompts), as TRL's ChatML
    examples (the reference as the assistant turn the collator splits off), and align's prompt tokens."""
    from align.data.prompts import NoReward, load_prompts

    prompts = load_prompts(typed, tokenizer, NoReward())
    if len(prompts) < n:
        raise SystemExit(f"bench/trl_objectives.py: {len(prompts)} prompts kept, the steps need {n}")
    rows = [{"messages": [*prompts.messages[i], {"role": "assistant", "content": prompts.references[i]}]}
            for i in range(n)]
    return rows, [prompts.prompt(i) for i in range(n)]


def gkd_prompts_match(collator, rows: list[dict[str, Any]], want: list[list[int]]) -> bool:
    """TRL's collator gives `generate` align's prompt tokens, example by example."""
    for row, ids in zip(rows, want):
        batch = collator([row])
        got = batch["prompts"][0][batch["prompt_attention_mask"][0].bool()].tolist()
        if got != ids:
            return False
    return True


def timed_gkd(base, clock: Clock, eos_ids: list[int]):
    """GKDTrainer with each `generate` call timed and counted (behaviour unchanged)."""

    class Timed(base):
        def generate_on_policy_outputs(self, model, inputs, generation_config):
            t0 = clock.now()
            out = base.generate_on_policy_outputs(model, inputs, generation_config)
            s = clock.step
            s["generation"] += clock.now() - t0
            s["calls"] += 1
            ids, _, labels = out
            width = inputs["prompts"].shape[1]
            done = labels[:, width:] != -100
            stopped = (torch.isin(ids[:, width:], torch.tensor(eos_ids, device=ids.device)) & done).any(dim=1)
            c = s["counts"]
            c["samples"] += int(ids.shape[0])
            c["completion_tokens"] += int(done.sum())
            c["prompt_tokens"] += int(inputs["prompt_attention_mask"].sum())
            c["stopped"] += int(stopped.sum())
            return out

    return Timed


def time_teacher(module: torch.nn.Module, clock: Clock) -> None:
    """Each teacher forward's seconds into the open step (CUDA synchronised at both ends)."""
    started: list[float] = []

    def before(*_):
        started.append(clock.now())

    def after(*_):
        clock.step["teacher"] += clock.now() - started.pop()

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


def gkd_arm(arm: str, typed, steps: int, warmup: int) -> dict:
    from datasets import Dataset
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from align.core.signatures import check_kwargs
    from align.data.tokenizer import load_tokenizer
    from align.objectives.reference import weights_sha256
    from align.objectives.teacher import load_teacher

    why = gkd_mismatch(typed)
    if why:
        raise SystemExit(f"bench/trl_objectives.py: {ARMS[arm]}: {why}")
    device = device_of(typed)
    cuda = device.type == "cuda"
    tokenizer = load_tokenizer(typed.model)
    o = typed.objective
    rows, want = gkd_examples(typed, tokenizer, steps * o.prompts_per_rollout)
    model = build_student(typed, tokenizer, device)
    sha = weights_sha256(model)
    teacher = load_teacher(typed)
    clock = Clock(cuda)
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = gkd_config_kwargs(typed, tmp, steps, cuda)
        check_kwargs(GKDConfig.__init__, kwargs, "bench.trl_objectives GKDConfig")
        trainer_kwargs = dict(model=model, teacher_model=teacher, args=GKDConfig(**kwargs),
                              train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                              callbacks=[step_clock(clock)])
        check_kwargs(GKDTrainer.__init__, trainer_kwargs, "bench.trl_objectives GKDTrainer")
        t0 = time.perf_counter()
        trainer = timed_gkd(GKDTrainer, clock, [tokenizer.eos_token_id])(**trainer_kwargs)
        setup_s = time.perf_counter() - t0
        match = gkd_prompts_match(trainer.data_collator, rows, want)
        time_teacher(trainer.teacher_model, clock)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        clock.ends.append(clock.now())
        trainer.train()
    window(clock, warmup, "GKD")
    accum = typed.trainer.grad_accum
    if clock.calls != [accum] * len(clock.calls):
        raise SystemExit(f"bench/trl_objectives.py: generate calls per step {clock.calls}; the bench needs "
                         f"trainer.grad_accum={accum} per optimizer step (one per micro-batch, lmbda=1)")
    step_s = [b - a for a, b in zip(clock.ends[warmup:-1], clock.ends[warmup + 1:])]
    gen, tea = clock.generation[warmup:], clock.teacher[warmup:]
    args = trainer.args
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    return grpo_measurement(arm, step_s, gen, [g + t for g, t in zip(gen, tea)], clock.counts[warmup:],
                            torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                            attn=model.config._attn_implementation, weights_sha256=sha,
                            teacher_weights_sha256=weights_sha256(teacher), teacher_s=float(sum(tea)),
                            trl=settings(args, SETTINGS[arm]), setup_s=round(setup_s, 2), tokens_match_align=match,
                            setting=f"TRL {settings(args, ())['version']} GKD, lmbda={args.lmbda}, beta={args.beta}, "
                                    f"{per_step} completions per step in {args.gradient_accumulation_steps} generate "
                                    f"calls of {args.per_device_train_batch_size}, gradient_checkpointing="
                                    f"{args.gradient_checkpointing}")


# ------------------------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", required=True, choices=sorted(ARMS))
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps in all, the warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="first steps not measured")
    ap.add_argument("--tiny", action="store_true", help="the experiment's tiny preset on the CPU: measures nothing")
    ap.add_argument("--pairs-file", type=Path, help="trl_kto, trl_reward: the bench pairs (bench/pairs.py)")
    ap.add_argument("--teacher", type=Path, help="trl_gkd: the teacher checkpoint (bench/teacher.py)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if not 1 <= a.warmup < a.steps:
        raise SystemExit(f"bench/trl_objectives.py: --warmup {a.warmup} must be >= 1 and below --steps {a.steps}")
    flag = DATA[a.arm][1]
    given = a.teacher if a.arm == "trl_gkd" else a.pairs_file
    if given is None:
        raise SystemExit(f"bench/trl_objectives.py: --arm {a.arm} reads {flag}")
    if a.arm == "trl_gkd":
        m = gkd_arm(a.arm, arm_config(a.arm, a.tiny, a.teacher), a.steps, a.warmup)
    else:
        run = kto_arm if a.arm == "trl_kto" else reward_arm
        m = run(a.arm, arm_config(a.arm, a.tiny), a.pairs_file, a.steps, a.warmup)
    a.out.write_text(json.dumps(m, indent=1))
    print(json.dumps({k: v for k, v in m.items() if k != "step_ms"}))


if __name__ == "__main__":
    main()
