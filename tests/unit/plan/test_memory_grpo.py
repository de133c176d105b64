"""The training-memory estimate of a GRPO run sizes its rollouts by the prompts it generates from (the
longest encoded prompt + objective.max_new_tokens), not by their bound data.max_seq_len, and a refusal
names the keys that lower the estimate of the composition at hand (align/plan/memory_levers.py),
never one it does not read."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from align.config import to_typed
from align.errors import ConfigError
from align.generation import Backend
from align.plan import memory
from align.plan.budget_auto import plan_sizes
from align.plan.generation_auto import kv_cache_tokens
from align.plan.memory_levers import levers
from align.plan.planner import plan

CPU = torch.device("cpu")
PROMPTS = ["1+1=", "What is two plus three? Answer with the number only, please.", "7+8="]


def _grpo(compose, tmp_path, *ov):
    """The README's shape of run (16 prompts x 16 completions of 4 new tokens, data.max_seq_len 1024) on a
    file of three short prompts."""
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": p, "reference": str(i)}) + "\n" for i, p in enumerate(PROMPTS)))
    return to_typed(compose(["objective=grpo", "logger=none", "allow_dirty=true", "data=jsonl_prompts",
                             f"data.path={f}", "objective.prompts_per_rollout=2", *ov]))


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def test_a_grpo_rollout_is_estimated_at_its_longest_prompt_plus_the_new_tokens(compose, tokenizer, tmp_path):
    cfg = _grpo(compose, tmp_path)
    longest = max(len(tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                              add_generation_prompt=True),
                                add_special_tokens=False)["input_ids"]) for p in PROMPTS)
    width = longest + cfg.objective.max_new_tokens
    job = plan(cfg, CPU)
    est, planned, prompt_tokens = job.estimate, job.sized, job.prompt_tokens
    assert prompt_tokens == longest < 64 < cfg.data.max_seq_len == 1024
    rows = cfg.objective.prompts_per_rollout * cfg.objective.group_size  # one micro-batch (grad_accum 1)
    assert est.tokens_per_micro_batch == rows * _ceil(width, cfg.sampler.pad_to_multiple_of)
    new = cfg.objective.max_new_tokens
    hf, align = rows * (_ceil(longest, 8) + new), (rows + 1) * _ceil(longest + new, 64)
    assert kv_cache_tokens(planned, rows, prompt_tokens) == max(hf, align)  # auto: either engine may run
    for backend, want in ((Backend.hf, hf), (Backend.align, align)):
        objective = dataclasses.replace(planned.objective, generation_backend=backend)
        chosen = dataclasses.replace(planned, objective=objective)
        assert kv_cache_tokens(chosen, rows, prompt_tokens) == want
    bound = memory.estimate_memory(planned, CPU)  # the config alone: every sequence data.max_seq_len wide
    assert bound.tokens_per_micro_batch == rows * 1024 and est.total * 4 < bound.total
    record = plan_sizes(cfg, CPU)[1]["rollout_width"]  # the manifest's model.extra.rollout_width
    assert (record["requested"], record["resolved"], record["prompt_tokens"]) == (1024, width, longest)


def test_preflight_holds_the_real_rollout_not_its_bound_against_the_device(compose, tmp_path, monkeypatch):
    """On a device between the two estimates a GRPO run on short prompts is accepted (it was refused or
    accepted by the host's free memory at that moment), and the line says what it sized the rollout by."""
    from align.run.preflight_checks import run_preflight

    cfg = _grpo(compose, tmp_path)
    job = plan(cfg, CPU)
    est, planned, prompt_tokens = job.estimate, job.sized, job.prompt_tokens
    bound = memory.estimate_memory(planned, CPU).total
    monkeypatch.setattr(memory, "device_memory", lambda device: (est.total + bound) // 2)
    line = [c for c in run_preflight(cfg) if c.name == "params and memory"][0].detail
    assert f"rollout sequences of at most {prompt_tokens + 4} tokens" in line, line
    monkeypatch.setattr(memory, "device_memory", lambda device: est.total // 2)
    with pytest.raises(ConfigError) as e:
        run_preflight(cfg)
    msg = str(e.value)
    assert msg.startswith("model.allow_over_memory: the training-memory estimate does not fit") and "\n" not in msg
    assert "each of these lowers it: " in msg and "trainer.grad_accum=2 (~" in msg, msg
    assert "sampler.micro_batch_size" not in msg and "data.max_seq_len=" not in msg, msg


NOT_READ_BY_GRPO = {"sampler.micro_batch_size", "data.max_seq_len"}
COMPOSITIONS = [  # (overrides, keys the refusal must name, keys it must not)
    (["objective=grpo"], {"trainer.grad_accum", "objective.group_size"},
     {"sampler.max_tokens", "objective.max_new_tokens", *NOT_READ_BY_GRPO}),  # 2 new tokens pad as 4 do
    (["objective=grpo", "sampler=budget", "sampler.max_tokens=512", "objective.updates_per_rollout=2"],
     {"sampler.max_tokens"}, {"trainer.grad_accum", *NOT_READ_BY_GRPO}),
    # hf frees its cache after a call, so the copy's dtype lowers the peak (align's engine holds an fp32
    # cache on the CPU beside the update: a bf16 copy with a bf16 cache weighs less than no copy there)
    (["objective=grpo", "objective.generation_dtype=bf16", "objective.max_new_tokens=32",
      "objective.generation_backend=hf"],
     {"trainer.grad_accum", "objective.max_new_tokens", "objective.generation_dtype"}, NOT_READ_BY_GRPO),
    ([], {"sampler.max_tokens"}, {"sampler.micro_batch_size", "trainer.grad_accum"}),  # sft, budget auto
    (["sampler=shuffle"], {"sampler.micro_batch_size", "data.max_seq_len"}, {"sampler.max_tokens"}),
    (["objective=dpo", "data=gsm8k_pairs", "sampler=shuffle"], {"sampler.micro_batch_size"}, {"sampler.max_tokens"}),
]


@pytest.mark.parametrize("overrides,named,not_named", COMPOSITIONS, ids=[" ".join(c[0]) or "sft" for c in COMPOSITIONS])
def test_every_key_a_refusal_names_lowers_the_estimate_and_is_read_by_the_composition(compose, overrides, named,
                                                                                       not_named):
    """Each named `key=value`, typed on the command line after the composition, is accepted (a key the
    composition does not read is refused there) and plans to a smaller estimate."""
    base = ["logger=none", "allow_dirty=true", "data.max_records=200", *overrides]
    job = plan(to_typed(compose(base)), CPU)
    found = levers(job.sized, CPU, 1, job.prompt_tokens)
    for lever in found:
        setting = lever.split(" (~")[0]
        assert plan(to_typed(compose([*base, setting])), CPU).estimate.total < job.estimate.total, setting
    keys = {lever.split("=")[0] for lever in found}
    assert named <= keys and not keys & not_named, keys


def test_the_align_engine_allocates_the_positions_the_plan_counts(tiny_model):
    """The plan's count (align/generation/engine.py `kv_positions`) is the cache align's engine builds."""
    from align.generation import EngineConfig, SamplingSpec, build_engine
    from align.generation.engine import kv_positions

    engine = build_engine(EngineConfig(backend=Backend.align, batch_size=3), tiny_model(), pad_token_id=0,
                          eos_token_ids=(2,))
    engine.generate([[5, 6, 7], [8] * 41], SamplingSpec(max_new_tokens=30, temperature=0, stop_token_ids=()))
    cache = engine._state.cache
    assert cache.num_slots * cache.max_len == kv_positions(Backend.align, 3, 41, 30, 8)
