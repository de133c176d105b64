"""GRPO's engine settings at `auto` (align/plan/generation_auto.py, align/plan/budget_auto.py): a
bf16 generation copy on one CUDA device over weights that are not bf16 already, the training model
everywhere else; the whole rollout in one engine call, capped where its KV cache would not fit (on a
CPU at 256 rows, the fixed default before auto). The manifest records both with why; the memory
estimate counts the copy and the KV cache; trainer.compile=auto compiles a grpo policy's blocks only
beside a copy."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from align.config import GenerationDtype, to_typed
from align.errors import ConfigError
from align.plan import memory
from align.plan.budget_auto import plan_generation, resolve_generation_batch_size
from align.plan.compile_auto import resolve_compile
from align.plan.generation_auto import CPU_ROWS, resolve_generation_dtype
from align.run.cli import compose

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
H200 = 143_771 * 1024**2


def grpo(*overrides: str):
    return to_typed(compose(["logger=none", "objective=grpo", *overrides]))


def test_the_defaults_are_auto():
    o = grpo().objective
    assert o.generation_dtype == GenerationDtype.auto and o.generation_batch_size == "auto"


@pytest.mark.parametrize("overrides, device, want, said", [
    ([], "cuda", GenerationDtype.bf16, "resolved bf16: one CUDA device, float32 weights"),
    ([], "cpu", GenerationDtype.same, "device cpu"),
    (["model.dtype=bfloat16"], "cuda", GenerationDtype.same, "model.dtype=bfloat16"),
    (["parallel=fsdp"], "cuda", GenerationDtype.same, "parallel=fsdp"),
    (["trainer.precision=fp32"], "cuda", GenerationDtype.same, "trainer.precision=fp32"),
    (["model.lora.enabled=true"], "cuda", GenerationDtype.same, "model.lora.enabled=true"),
    (["objective.generation_dtype=fp32"], "cpu", GenerationDtype.fp32, "generation_dtype=fp32 as configured"),
    (["objective.generation_dtype=same"], "cuda", GenerationDtype.same, "generation_dtype=same as configured"),
])
def test_generation_dtype_auto_copies_only_on_one_cuda_device_over_weights_that_are_not_bf16(
        overrides, device, want, said):
    got, why = resolve_generation_dtype(grpo(*overrides), device)
    assert got == want and said in why


def test_a_copy_under_fsdp_is_refused_when_asked_for_but_auto_is_accepted():
    assert grpo("parallel=fsdp").objective.generation_dtype == GenerationDtype.auto
    for dtype in ("bf16", "fp32"):
        with pytest.raises(ConfigError, match="a generation copy needs parallel=single"):
            grpo("parallel=fsdp", f"objective.generation_dtype={dtype}")


def test_generation_batch_size_auto_on_a_cpu_is_the_rollout_up_to_256_rows():
    small = grpo("objective.prompts_per_rollout=4", "objective.group_size=4")
    assert resolve_generation_batch_size(small, CPU)[0] == 16
    big = grpo("objective.prompts_per_rollout=64", "objective.group_size=8")
    rows, why = resolve_generation_batch_size(big, CPU)
    assert rows == CPU_ROWS == 256 and "on cpu" in why
    assert grpo().objective.prompts_per_rollout * grpo().objective.group_size == 256  # the embedded default: one call
    assert resolve_generation_batch_size(grpo("objective.generation_batch_size=8"), CUDA, H200) == (
        8, "objective.generation_batch_size=8 as configured")
    with pytest.raises(ConfigError, match="an int >= 1 or auto"):
        grpo("objective.generation_batch_size=0")


def test_generation_batch_size_auto_on_cuda_is_the_whole_rollout_capped_where_its_kv_cache_would_not_fit():
    cfg = grpo("objective.prompts_per_rollout=64", "objective.group_size=8", "objective.max_new_tokens=256",
               "data.max_seq_len=1024")
    rows, why = resolve_generation_batch_size(cfg, CUDA, H200)
    assert rows == 512 and "the whole rollout (64 x 8 = 512 rows) in one call" in why
    from align.plan.chunk_auto import plan_loss_chunk

    sized = plan_loss_chunk(cfg, CUDA)[0]
    sized = dataclasses.replace(sized, trainer=dataclasses.replace(sized.trainer, compile_memory_budget=None))
    est = memory.estimate_memory(sized, CUDA)
    working = max(est.activations + est.logits, est.grads)  # one micro-batch a step: grads replace activations
    assert not est.grads_accumulate and est.kv_cache_held  # auto: align's engine, which keeps its cache
    share = 0.85  # compiled blocks on CUDA (trainer.compile=auto beside the copy auto resolves to)
    hf = grpo("objective.prompts_per_rollout=64", "objective.group_size=8", "objective.max_new_tokens=256",
              "data.max_seq_len=1024", "objective.generation_backend=hf")
    # hf frees its cache after a call: it fits beside the resident states alone; align's beside the update too
    for c, beside in ((hf, memory.resident_bytes(cfg, CUDA)), (cfg, memory.resident_bytes(cfg, CUDA) + working)):
        per_row = memory.kv_cache_bytes(c, CUDA, 1)
        small = int((beside + 100.5 * per_row) / share)  # the headroom holds 100 rows' KV cache and half a row
        rows, why = resolve_generation_batch_size(c, CUDA, small)
        assert rows == 100 and "100 rows per call, the most of the whole rollout" in why, (c.objective, why)
        assert resolve_generation_batch_size(c, CUDA, beside)[0] == 1  # nothing left: one row, the estimate refuses


def test_plan_generation_records_requested_resolved_and_why_and_leaves_other_objectives_alone():
    cfg, rec = plan_generation(grpo(), CUDA, H200)
    assert cfg.objective.generation_dtype == GenerationDtype.bf16 and cfg.objective.generation_batch_size == 256
    assert rec["dtype"]["requested"] == "auto" and rec["dtype"]["resolved"] == "bf16"
    assert rec["batch_size"] == {"requested": "auto", "resolved": 256, "why": rec["batch_size"]["why"]}
    assert plan_generation(to_typed(compose(["logger=none"])), CUDA)[1] is None


def test_the_built_run_records_what_auto_resolved_to_on_this_cpu(tmp_path):
    from tests.conftest import build_trainer

    t = build_trainer(tmp_path, "objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4",
                      "trainer.max_steps=1", "trainer.export=false", "trainer.device=cpu")
    rec = t.model_info["generation"]  # the manifest's model.extra.generation (align/run/record.py)
    assert rec["dtype"] == {"requested": "auto", "resolved": "same", "why": rec["dtype"]["why"]}
    assert "device cpu" in rec["dtype"]["why"]
    assert rec["batch_size"]["requested"] == "auto" and rec["batch_size"]["resolved"] == 16
    loss = t.objective.describe()["loss"]
    assert loss["generation_dtype"] == "same" and loss["engine"]["batch_size"] == 16
    assert loss["engine"]["weights"].startswith("shared")
    width = t.model_info["rollout_width"]  # the plan sized the rollouts by the prompts the run read
    assert width["resolved"] == width["prompt_tokens"] + 4 < width["requested"] == t.cfg.data.max_seq_len
    assert width["prompt_tokens"] == int(t.objective.prompts.data.lengths.max())


def test_the_memory_estimate_counts_the_generation_copy_in_its_dtype():
    same = memory.estimate_memory(grpo(*RESOLVED, "objective.generation_dtype=same"), CUDA)
    for dtype, nbytes in (("bf16", 2), ("fp32", 4)):
        est = memory.estimate_memory(grpo(*RESOLVED, f"objective.generation_dtype={dtype}"), CUDA)
        assert est.generation_copy == est.params.total * nbytes
        assert est.total == dataclasses.replace(est, generation_copy=0).total + est.params.total * nbytes
    assert same.generation_copy == 0
    assert memory.estimate_memory(grpo(*RESOLVED), CUDA).generation_copy == same.params.total * 2  # auto: bf16 on CUDA
    assert memory.estimate_memory(grpo(*RESOLVED), CPU).generation_copy == 0  # auto: same on a CPU
    sft = to_typed(compose(["logger=none"]))  # generates nothing
    assert memory.kv_cache_bytes(sft, CUDA) == memory.generation_copy_bytes(sft, 10**9, "cuda") == 0


def test_the_memory_estimate_counts_the_kv_cache_of_one_engine_call():
    """positions x layers x 2 x kv_heads x head_dim x bytes, read off the model config; positions in the layout
    of the engine that may run (auto: the larger of align's slots and spare, and hf's padded rows); it lives in
    place of the step's working set, so a KV cache larger than that is the peak's."""
    cfg = grpo(*KV_ROLLOUT, "objective.generation_batch_size=512")
    _, config = memory.meta_model(cfg.model)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 2
    tokens = 56 + 200  # the longest prompt (256 - 200), a multiple of 8 and of 64 with the new tokens

    def want(rows):  # align's cache: the rows' slots and one spare, each 256 positions (hf's: rows x 256)
        return (rows + 1) * tokens * per_position

    est = memory.estimate_memory(cfg, CUDA)
    assert est.kv_cache == want(512)
    working = est.activations + est.logits + est.grads
    assert est.kv_cache > working  # the cache outweighs the update's working set
    resident = est.weights + est.optimizer + est.reference + est.generation_copy
    # align's engine (auto) keeps its cache through the update; hf's lives in place of the working set
    assert est.kv_cache_held and est.total == resident + est.kv_cache + working and "(held between calls)" in est.line()
    assert dataclasses.replace(est, kv_cache_held=False).total == resident + est.kv_cache
    assert dataclasses.replace(est, kv_cache=0).total < est.total
    smaller = memory.estimate_memory(grpo(*KV_ROLLOUT, "objective.generation_batch_size=256"), CUDA)
    assert smaller.kv_cache == want(256) and "KV cache" in est.line()
    assert memory.estimate_memory(grpo(*KV_ROLLOUT), CUDA).kv_cache == want(1024)  # auto: the rollout
    hf = memory.estimate_memory(grpo(*KV_ROLLOUT, "objective.generation_batch_size=512",
                                     "objective.generation_backend=hf"), CUDA)
    assert hf.kv_cache == 512 * tokens * per_position and not hf.kv_cache_held


RESOLVED = ["trainer.loss_chunk_tokens=0", "trainer.compile_memory_budget=null"]  # the estimate reads numbers
KV_ROLLOUT = [*RESOLVED, "objective.generation_dtype=bf16", "objective.prompts_per_rollout=64",
              "objective.group_size=16", "objective.max_new_tokens=200", "data.max_seq_len=256",
              "trainer.grad_accum=1024"]  # one completion per micro-batch


@pytest.mark.parametrize("overrides, compiled, said", [
    ([], True, "trainer.compile=auto resolved on"),
    (["objective.generation_dtype=bf16"], True, "trainer.compile=auto resolved on"),
    (["objective.generation_dtype=same"], False, "generation_dtype resolved to same generates through"),
    (["model.dtype=bfloat16"], False, "generation_dtype resolved to same generates through"),
    (["parallel=fsdp"], False, "generation_dtype resolved to same generates through"),
])
def test_compile_auto_compiles_a_grpo_policy_only_beside_a_generation_copy(overrides, compiled, said):
    cfg, rec = resolve_compile(grpo(*overrides), "cuda")
    assert cfg.trainer.compile is compiled and said in rec["trainer"]["why"]
    off, rec = resolve_compile(grpo(), "cpu")
    assert off.trainer.compile is False and "device cpu" in rec["trainer"]["why"]
