"""TRL's GRPOTrainer as the GRPO bench's reference arm (not an align run, so it lives here as code). It
builds the policy exactly as align builds it for the GRPO bench experiment (bench/grpo_bench: the dense
bench model, the same transformers config and seed, align.models.build_model) and trains it on the
same prompts (the bundled GSM8K train questions through the same chat template) with the same reward
(align's gsm8k verifier, through a TRL reward function):

  trl_grpo   GRPOTrainer, transformers generation (`model.generate`, dynamic cache), no vLLM

    python bench/trl_grpo.py --arm trl_grpo --steps 3 --warmup 1 --out m.json [--tiny]

The rollout batch is the experiment's: prompts_per_rollout x group_size completions per optimizer step
(generation_batch_size), in trainer.grad_accum micro-batches (per_device_train_batch_size x
gradient_accumulation_steps = generation_batch_size, so steps_per_generation = gradient_accumulation_steps:
one optimizer step per generation, checked on the built config), num_iterations=1, beta=0 (no
reference model, as kl_coef=0 in align), max_completion_length = objective.max_new_tokens, the same
temperature and top-p, top-k off. TRL then computes no separate old-log-prob pass (its loss takes the
update forward's own detached log-probs, as align's does with one update per rollout).

TRL settings otherwise (GRPOConfig, checked by name against the installed signature): bf16=True over the
fp32 policy (autocast, fp32 master weights), adamw_torch_fused, the experiment's lr and clip, constant
schedule, gradient_checkpointing=False (GRPOConfig defaults it to True; align recomputes nothing),
use_vllm=False (vLLM is not installed on the bench machine), dataset taken in order (shuffle_dataset=False).

Timed per step (a step-end callback with CUDA synchronised): the whole step, generation alone
(`_generate_single_turn`: the `generate` call and its EOS masking), the rollout phase
(`_generate_and_score_completions`: generation, reward, advantages); the update is the step minus the
rollout phase. Counted per rollout: completions, completion tokens (up to and including the first EOS),
prompt tokens, completions that stopped on EOS. Writes the raw measurement to --out; bench/run.py derives
the rates (bench/common.grpo_rates).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import experiment_config, grpo_measurement  # noqa: E402
from bench.trl_arm import build_policy, device_of, trl_settings  # noqa: E402

ARMS = ("trl_grpo",)
EXPERIMENT = "bench/grpo_bench"
REFERENCE_ARMS = {arm: EXPERIMENT for arm in ARMS}
"""reference arm -> the align experiment whose model, prompts and rollout shape it uses."""
DATA_FILE, DATA_FLAG = None, None
"""The prompts are the bundled GSM8K questions the experiment names: no file written by the harness."""
SETTINGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
            "steps_per_generation", "num_generations", "num_iterations", "max_completion_length", "use_vllm",
            "use_transformers_continuous_batching", "cache_implementation", "bf16", "optim", "gradient_checkpointing",
            "beta", "loss_type", "learning_rate", "max_grad_norm", "lr_scheduler_type", "temperature", "top_p",
            "top_k")


def grpo_config_kwargs(typed, output_dir: str, steps: int, cuda: bool) -> dict[str, Any]:
    """GRPOConfig's kwargs (module doc: which settings and why)."""
    o = typed.objective
    rollout = o.prompts_per_rollout * o.group_size
    micro = rollout // typed.trainer.grad_accum
    return dict(output_dir=output_dir, per_device_train_batch_size=micro,
                gradient_accumulation_steps=typed.trainer.grad_accum, generation_batch_size=rollout,
                num_generations=o.group_size, num_iterations=1, max_completion_length=o.max_new_tokens,
                temperature=o.temperature, top_p=o.top_p, top_k=0, beta=0.0, epsilon=o.clip_low,
                epsilon_high=o.clip_high, use_vllm=False, max_steps=steps, learning_rate=typed.optimizer.lr,
                lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=typed.optimizer.max_grad_norm, bf16=cuda,
                use_cpu=not cuda, optim="adamw_torch_fused" if cuda else "adamw_torch", gradient_checkpointing=False,
                shuffle_dataset=False, seed=typed.trainer.seed, save_strategy="no", report_to=[],
                logging_steps=10_000, dataloader_num_workers=0, disable_dropout=True, log_completions=False)


def check_rollout_shape(args, typed) -> None:
    """One optimizer step per generation of prompts_per_rollout x group_size completions, as the built
    config resolved it."""
    o = typed.objective
    want = o.prompts_per_rollout * o.group_size
    if (args.generation_batch_size, args.steps_per_generation) != (want, args.gradient_accumulation_steps):
        raise SystemExit(f"bench/trl_grpo.py: GRPOConfig resolved generation_batch_size={args.generation_batch_size}, "
                         f"steps_per_generation={args.steps_per_generation} (gradient_accumulation_steps="
                         f"{args.gradient_accumulation_steps}); the bench needs {want} completions per optimizer step")
    if want % typed.trainer.grad_accum:
        raise SystemExit(f"bench/trl_grpo.py: {want} completions do not split into trainer.grad_accum="
                         f"{typed.trainer.grad_accum} equal micro-batches")


def gsm8k_examples(typed, tokenizer, n: int) -> list[dict[str, Any]]:
    """The first `n` prompts align's prompt loader keeps (same records, same length limit), each as TRL's
    conversational prompt with its reference answer."""
    from align.data.prompts import split_record
    from align.data.sources import load_records

    limit = typed.data.max_seq_len - typed.objective.max_new_tokens
    out = []
    for r in load_records(typed.data, {}):
        messages, ref = split_record(r)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit:
            out.append({"prompt": messages, "answer": ref})
        if len(out) == n:
            return out
    raise SystemExit(f"bench/trl_grpo.py: {len(out)} prompts fit, {n} needed")


def reward_function(typed):
    """align's reward (reward.weights) as a TRL reward function: completion text against the answer."""
    from align.rewards import WeightedReward

    reward = WeightedReward(typed.reward.weights)

    def gsm8k(completions, answer, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward.score(t, a).total for t, a in zip(texts, answer)]

    return gsm8k


class Clock:
    """Per-phase seconds and per-rollout counts, appended in order."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.steps: list[float] = []
        self.generation: list[float] = []
        self.rollout: list[float] = []
        self.counts: list[dict[str, int]] = []

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def timed_trainer(base, clock: Clock, eos_ids: list[int]):
    """GRPOTrainer with its generation and rollout phases timed and counted (behaviour unchanged)."""

    class Timed(base):
        def _generate_single_turn(self, *args, **kwargs):
            t0 = clock.now()
            out = super()._generate_single_turn(*args, **kwargs)
            clock.generation.append(clock.now() - t0)
            return out

        def _generate_and_score_completions(self, inputs):
            t0 = clock.now()
            out = super()._generate_and_score_completions(inputs)
            clock.rollout.append(clock.now() - t0)
            ids, mask = out["completion_ids"], out["completion_mask"]
            stopped = (torch.isin(ids, torch.tensor(eos_ids, device=ids.device)) & mask.bool()).any(dim=1)
            clock.counts.append({"samples": int(ids.shape[0]), "completion_tokens": int(mask.sum()),
                                 "prompt_tokens": int(out["prompt_mask"].sum()), "stopped": int(stopped.sum())})
            return out

    return Timed


def grpo_arm(arm: str, typed, steps: int, warmup: int) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from align.core.signatures import check_kwargs
    from align.data.tokenizer import load_tokenizer
    from align.objectives.reference import weights_sha256

    device = device_of(typed)
    cuda = device.type == "cuda"
    tokenizer = load_tokenizer(typed.model)
    model = build_policy(typed, tokenizer, device)
    sha = weights_sha256(model)
    clock = Clock(cuda)

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            clock.steps.append(clock.now())

    examples = gsm8k_examples(typed, tokenizer, steps * typed.objective.prompts_per_rollout)
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = grpo_config_kwargs(typed, tmp, steps, cuda)
        check_kwargs(GRPOConfig.__init__, kwargs, "bench.trl_grpo GRPOConfig")
        config = GRPOConfig(**kwargs)
        check_rollout_shape(config, typed)
        trainer_kwargs = dict(model=model, reward_funcs=[reward_function(typed)], args=config,
                              train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
                              callbacks=[StepClock()])
        cls = timed_trainer(GRPOTrainer, clock, [tokenizer.eos_token_id])
        check_kwargs(GRPOTrainer.__init__, trainer_kwargs, "bench.trl_grpo GRPOTrainer")
        trainer = cls(**trainer_kwargs)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = clock.now()
        trainer.train()
    n = len(clock.steps)
    if n <= warmup or len(clock.rollout) != n or len(clock.generation) != n:
        raise SystemExit(f"bench/trl_grpo.py: {n} steps, {len(clock.rollout)} rollouts, {len(clock.generation)} "
                         f"generate calls timed; the bench needs one of each per step and more than --warmup {warmup}")
    bounds = [start, *clock.steps]
    step_s = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    return grpo_measurement(arm, step_s[warmup:], clock.generation[warmup:], clock.rollout[warmup:],
                            clock.counts[warmup:], torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                            attn=model.config._attn_implementation, weights_sha256=sha,
                            trl={"version": trl_settings(trainer.args)["version"],
                                 **{k: _plain(getattr(trainer.args, k, None)) for k in SETTINGS}})


def _plain(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", required=True, choices=sorted(ARMS))
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps (= rollouts) in all, the warm-up included")
    ap.add_argument("--warmup", type=int, default=1, help="first steps not measured")
    ap.add_argument("--tiny", action="store_true", help="the experiment's tiny preset on the CPU: measures nothing")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not 1 <= a.warmup < a.steps:
        raise SystemExit(f"bench/trl_grpo.py: --warmup {a.warmup} must be >= 1 and below --steps {a.steps}")
    m = grpo_arm(a.arm, experiment_config(EXPERIMENT, a.tiny), a.steps, a.warmup)
    a.out.write_text(json.dumps(m, indent=1))
    print(json.dumps({k: v for k, v in m.items() if k != "step_ms"}))


if __name__ == "__main__":
    main()
