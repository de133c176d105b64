"""bench/run.py on the CPU, running nothing: arm names resolve to experiment configs or reference arms,
the command lines carry what the command owns, bad arms exit 2 before any run, and the measurement
arithmetic (per GPU, both MFUs, ratios) is what the table says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import run as harness
from bench.common import EXPERIMENTS, add_ratios, compose_typed, experiment_names, model_flops, summarise
from tests.config.conftest import dry_run


@pytest.mark.parametrize("token", ["dense_best", "bench/dense_best", "experiment=bench/dense_best"])
def test_an_experiment_name_resolves_to_its_config(token):
    arm = harness.resolve(token)
    assert (arm.name, arm.experiment) == ("dense_best", "bench/dense_best")


def test_every_bench_config_is_an_arm_and_reference_arms_are_not_configs():
    assert experiment_names() == sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))
    for ref in harness.REFERENCE_ARMS:
        assert harness.resolve(ref).experiment is None
        assert ref not in experiment_names()


def test_an_unknown_arm_exits_2_naming_what_exists(out, capsys):
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "dense_bset"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "dense_bset: no such arm" in err and "dense_best" in err and "hf_padded" in err
    assert not out.exists()


def test_dry_run_prints_each_command_and_writes_nothing(out, capsys):
    cmds = dry_run(capsys, "hf_padded", "dense_best", "dense_eager_fsdp", "--nproc", "4", "--profile", "dense_best")
    rows = out / "rows.jsonl"
    assert " -m align.train experiment=bench/dense_best " in cmds["dense_best"]
    assert f"data.path={rows}" in cmds["dense_best"]
    assert cmds["dense_best"].endswith(f"hydra.run.dir={out}/runs/dense_best")
    fsdp = cmds["dense_eager_fsdp"]
    assert fsdp.startswith("bash ") and "launchers/torchrun.sh --nproc 4 experiment=bench/dense_eager_fsdp" in fsdp
    assert "bench/hf_arm.py --arm hf_padded --steps 30 --warmup 8" in cmds["hf_padded"]
    kernels = cmds["kernels of dense_best"]
    assert "-m align.tools.probe probe=kernels" in kernels and "experiment=bench/dense_best" in kernels
    assert not out.exists()


def test_the_command_composes_to_the_experiment_plus_what_the_command_owns(out):
    a = harness.parse_args(["dense_eager", "--steps", "12", "--warmup", "3", "--tiny"])
    arm = harness.plan_align(harness.resolve("dense_eager"), a, out)
    typed = compose_typed(arm.overrides)
    assert typed.trainer.max_steps == 12 and typed.data.path == str(out / "rows.jsonl")
    assert typed.sampler.max_tokens == 24576  # the experiment's own value survives
    # --tiny: the family's tiny preset on the CPU, the 0.89 B shape overrides gone
    assert typed.model.preset.value == "tiny" and typed.trainer.device.value == "cpu"
    assert "hidden_size" not in typed.model.overrides


def test_warmup_must_leave_measured_steps(out, capsys):
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "vocab_chunked"])  # its max_steps is 8, --warmup defaults to 10
    assert e.value.code == 2 and "trainer.max_steps=8" in capsys.readouterr().err


def test_a_value_the_schema_refuses_exits_2_naming_the_arm(out, capsys):
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "dense_eager", "--steps", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "dense_eager" in err and "trainer.max_steps" in err


def test_baselines_default_to_the_reference_arms_of_the_command():
    assert harness.parse_args(["hf_padded", "dense_best", "hf_ceiling"]).baseline == ["hf_padded", "hf_ceiling"]
    assert harness.parse_args(["dense_best", "dense_eager", "--baseline", "dense_eager"]).baseline == ["dense_eager"]


def _write_run(run_dir: Path, per_step: list[tuple[float, int, int, float]]) -> None:
    run_dir.mkdir(parents=True)
    rows = [dict(elapsed_s=t, real_tokens=real, tokens=tok, model_flops=fl, step_time_s=0.5, loss=1.0,
                 mem_peak_gib=10.0 + i, mem_alloc_retries=0) for i, (t, real, tok, fl) in enumerate(per_step)]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "provenance.json").write_text(json.dumps({"model": {"attn_implementation_resolved": "sdpa"},
                                                         "dynamo": {"recompiles": 0, "graph_breaks": 0}}))


def test_an_align_run_is_measured_after_warmup_and_per_gpu(tmp_path):
    arm = harness.Arm("two", "bench/dense_eager_fsdp", run_dir=tmp_path / "two", gpus=2)
    # step 1 (warm-up) is not measured: the clock starts at its end
    _write_run(arm.run_dir, [(5.0, 999, 999, 9e12), (6.0, 800, 1000, 2e12), (7.0, 800, 1000, 2e12)])
    m = harness.read_align_run(arm, warmup=1, useful_per_token=1e9)
    assert (m["seconds"], m["steps_measured"]) == (2.0, 2)
    assert (m["real_tokens"], m["tokens"]) == (800, 1000)  # history sums ranks; the bench reports per GPU
    assert m["counted_flops"] == 4e12 and m["useful_flops"] == 800 * 1e9 and m["peak_mem_gib"] == 12.0
    r = summarise(m, ceiling_tflops=2.0)
    assert r["real_tokens_per_s"] == 400 and r["padding_waste"] == pytest.approx(0.2)
    assert r["useful_mfu"] == pytest.approx(0.2) and r["counted_mfu"] == pytest.approx(1.0)
    assert "per GPU of 2" in harness.notes(r)
    assert m["compile_s_measured"] is None and "COMPILED" not in harness.notes(r)  # a history without the key


def test_a_compile_inside_the_measured_steps_is_named_on_the_arms_row(tmp_path):
    """History rows carry the run's cumulative compile seconds: a graph compiled after the warm-up
    (a shape first met in step 2 of 3) puts its seconds into the rate, and the row says so."""
    arm = harness.Arm("late", "bench/dense_best", run_dir=tmp_path / "late")
    _write_run(arm.run_dir, [(5.0, 800, 800, 1e12), (47.0, 800, 800, 1e12), (48.0, 800, 800, 1e12)])
    rows = [json.loads(x) for x in (arm.run_dir / "history.jsonl").read_text().splitlines()]
    for r, spent in zip(rows, (40.0, 81.4, 81.5)):
        r["compile_s"] = spent
    (arm.run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = harness.read_align_run(arm, warmup=1, useful_per_token=1.0)
    assert m["compile_s_measured"] == pytest.approx(41.5)
    assert "COMPILED 41.5 s INSIDE THE MEASURED STEPS" in harness.notes(summarise(m, ceiling_tflops=None))
    clean = harness.read_align_run(arm, warmup=2, useful_per_token=1.0)  # the warm-up took the compile
    assert clean["compile_s_measured"] == pytest.approx(0.1) and "COMPILED" not in harness.notes(clean)


def test_ratios_and_the_table_read_the_same_command(tmp_path):
    results = [summarise(dict(arm=n, seconds=1.0, steps_measured=1, real_tokens=real, tokens=real, counted_flops=None,
                              useful_flops=0.0, peak_mem_gib=None), ceiling_tflops=None)
               for n, real in (("hf_padded", 100.0), ("dense_best", 700.0))]
    results.append({"arm": "broken", "error": "exit 1: boom"})
    add_ratios(results, ["hf_padded"])
    assert results[1]["vs_hf_padded"] == pytest.approx(7.0) and results[2]["vs_hf_padded"] is None
    md = harness.table(results, None, ["hf_padded"])
    assert "| (2) dense_best | 700 |" in md and "| 7.00x |" in md and "exit 1: boom" in md


def test_the_handwritten_arm_steps_on_uniform_unpadded_rows_at_dense_bests_budget():
    from bench.common import experiment_config
    from bench.handwritten_arm import handwritten_arm, shape

    rows, width = shape(tiny=True)
    assert rows * 2048 <= experiment_config("bench/dense_best").sampler.max_tokens < (rows + 1) * 2048
    m = handwritten_arm("handwritten", experiment_config("bench/base_dense", tiny=True), 3, 1, tiny=True)
    assert m["steps_measured"] == 2 and m["real_tokens"] == m["tokens"] == 2 * rows * width
    assert m["useful_flops"] == pytest.approx(m["counted_flops"])  # no padding: every FLOP is useful
    assert m["seconds"] > 0 and m["final_loss"] == m["final_loss"]


GEMMA4_26B_LORA = ["model=gemma4_moe", "model.preset=full", "model.lora.enabled=true"]


@pytest.mark.parametrize("default, model", [("dense_default", ["model=mistral"]), ("moe_default", ["model=olmoe"]),
                                            ("gemma4_lora_default", GEMMA4_26B_LORA)])
def test_the_default_arms_carry_no_performance_override(default, model):
    """The *_default arms are the runs a user types: every performance knob at its default."""
    from bench.common import compose_typed, experiment_config

    arm = experiment_config(f"bench/{default}")
    plain = compose_typed([*model, "data=tokens", "data.path=rows.jsonl"])
    for group in ("sampler", "attention", "parallel"):
        assert getattr(arm, group) == getattr(plain, group), group
    assert (arm.trainer.compile, arm.optimizer.compile) == ("auto", "auto")
    assert (arm.trainer.loss_chunk_tokens, arm.trainer.grad_accum) == ("auto", 1)


def test_the_gemma4_lora_default_resolves_on_an_h200_to_the_fastest_measured_arm(monkeypatch):
    """What `model=gemma4_moe model.preset=full model.lora.enabled=true` resolves to on an H200 is
    gemma4_lora_noac, the fastest arm measured on it (docs/performance.md#gemma-4-26b-a4b-lora), in
    every field: the compile switches, the loss's chunk and the token budget as the trainer resolves
    them (align/trainer.py's build), the attention the family picks."""
    import dataclasses

    from align.plan import memory
    from align.plan.budget_auto import plan_sizes
    from align.plan.compile_auto import resolve_compile
    from bench.common import experiment_config

    h200 = 143_771 * 1024**2  # the device's total memory as docs/performance.md records it
    monkeypatch.setattr(memory, "device_memory", lambda device: h200)

    def on_h200(name):
        cfg, _ = resolve_compile(experiment_config(f"bench/{name}"), "cuda")
        cfg, sizes = plan_sizes(cfg, torch.device("cuda"), h200)
        attention = dataclasses.replace(cfg.attention, implementation=cfg.attention.chosen(cfg.model.family))
        return dataclasses.replace(cfg, attention=attention), sizes

    default, sizes = on_h200("gemma4_lora_default")
    fastest, _ = on_h200("gemma4_lora_noac")
    assert sizes["loss_chunk"]["requested"] == sizes["sampler_budget"]["requested"] == "auto"
    for group in (f.name for f in dataclasses.fields(default)):
        assert getattr(default, group) == getattr(fastest, group), group


def test_compile_artifacts_give_each_align_arm_its_own_file(out, capsys, tmp_path):
    cmds = dry_run(capsys, "hf_padded", "dense_best", "--compile-artifacts", str(tmp_path / "art"))
    assert f"trainer.compile_artifacts={tmp_path / 'art' / 'dense_best.bin'}" in cmds["dense_best"]
    assert "trainer.compile_artifacts" not in cmds["hf_padded"]
    assert "trainer.compile_artifacts" not in dry_run(capsys, "dense_best")["dense_best"]


def test_long_rows_join_the_bimodal_rows_at_their_length(tmp_path):
    """`--long-rows N --long-len L` adds N rows of exactly L tokens to the shared rows file, for an arm
    whose data.max_seq_len holds them (gemma4_lora_16k_rows); the bimodal rows stay as they were."""
    from bench.run import ROWS_FILE, parse_args, plan, write_data

    a = parse_args(["gemma4_lora_16k_rows", "--rows", "50", "--long-rows", "3", "--long-len", "5000"])
    data = write_data(plan(a.arms, a, tmp_path), a, tmp_path)
    lengths = [len(json.loads(line)["input_ids"]) for line in (tmp_path / ROWS_FILE).read_text().splitlines()]
    assert len(lengths) == 53 and lengths[-3:] == [5000] * 3 and max(lengths[:50]) <= 4096
    assert list(data.lengths[ROWS_FILE]) == lengths and "max 5000" in data.lines[0]
    plain = parse_args(["gemma4_lora_16k_rows", "--rows", "50"])
    write_data(plan(plain.arms, plain, tmp_path), plain, tmp_path)
    assert [len(json.loads(x)["input_ids"]) for x in (tmp_path / ROWS_FILE).read_text().splitlines()] == lengths[:50]
    ragged = parse_args(["gemma4_lora_16k_rows", "--rows", "50", "--long-rows", "5", "--long-len", "5000,9000"])
    write_data(plan(ragged.arms, ragged, tmp_path), ragged, tmp_path)
    got = [len(json.loads(x)["input_ids"]) for x in (tmp_path / ROWS_FILE).read_text().splitlines()]
    assert got[:50] == lengths[:50] and got[50:] == [5000, 9000, 5000, 9000, 5000]  # the lengths cycle
    for bad in (["--long-rows", "-1"], ["--long-len", "5000,x"], ["--long-len", "0"]):
        with pytest.raises(SystemExit):
            parse_args(["gemma4_lora_16k_rows", *bad])


def test_scaling_runs_the_fit_on_the_arms_own_configuration_at_widths_it_was_sized_for(out, capsys):
    """--scaling: probe=scaling with the arm's overrides, four widths a factor of two apart up to the
    bench's clip (a fourth point checks the constant term three cannot), and the rows a budget of the
    arm's size holds at the longest (an explicit budget; one row where the budget is auto)."""
    cmds = dry_run(capsys, "gemma4_lora_noac", "gemma4_lora_default",
                   "--scaling", "gemma4_lora_noac,gemma4_lora_default")
    fit = cmds["scaling of gemma4_lora_noac"]
    assert "-m align.tools.probe probe=scaling" in fit and "experiment=bench/gemma4_lora_noac" in fit
    assert "'probe.scaling.lengths=[512,1024,2048,4096]' probe.scaling.batch_size=2" in fit  # shlex-quoted
    assert fit.endswith(f"hydra.run.dir={out}/runs/scaling_gemma4_lora_noac") and "trainer.max_steps" not in fit
    assert "probe.scaling.batch_size=1" in cmds["scaling of gemma4_lora_default"]
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "hf_padded", "--scaling", "hf_padded"])
    assert e.value.code == 2 and "--scaling hf_padded: not an align arm" in capsys.readouterr().err


def test_the_dpo_default_arm_carries_no_performance_override_and_compiles_on_cuda():
    """dpo_default is the DPO run a user types; on CUDA its switches resolve to dpo_best's levers
    (compiled blocks; the reference auto picks precomputed once the run reads an epoch of the pairs:
    tests/unit/objectives/test_reference_auto.py)."""
    from align.config import ReferenceKind
    from align.plan.compile_auto import resolve_compile
    from bench.common import compose_typed, experiment_config

    arm = experiment_config("bench/dpo_default")
    plain = compose_typed(["model=mistral", "objective=dpo", "data=preference", "data.path=pairs.jsonl"])
    for group in ("sampler", "attention", "parallel"):
        assert getattr(arm, group) == getattr(plain, group), group
    assert (arm.trainer.compile, arm.optimizer.compile, arm.trainer.loss_chunk_tokens) == ("auto", "auto", "auto")
    assert arm.objective.reference == ReferenceKind.auto and arm.trainer.grad_accum == 1
    on, _ = resolve_compile(arm, "cuda")
    assert on.trainer.compile is True and experiment_config("bench/dpo_best").trainer.compile is True


def test_the_grpo_default_resolves_on_an_h200_to_grpo_best_but_its_optimizer_step(monkeypatch):
    """grpo_default (GRPO's own defaults on grpo_bench's setup) resolves on one H200 to grpo_best, the
    fastest GRPO arm measured (docs/performance.md#grpo), in every field as the trainer resolves them:
    a bf16 generation copy, the whole rollout (512 rows) in one engine call, compiled decoder blocks.
    The one field apart is optimizer.compile: the default compiles the step (dense_default's lever),
    grpo_best keeps base_dense's eager step. grpo_bench keeps the engine settings it measures as given."""
    import dataclasses

    from align.config import GenerationDtype
    from align.plan import memory
    from align.plan.budget_auto import plan_sizes
    from align.plan.compile_auto import resolve_compile
    from bench.common import experiment_config

    h200 = 143_771 * 1024**2
    monkeypatch.setattr(memory, "device_memory", lambda device: h200)

    def on_h200(name):
        cfg, _ = resolve_compile(experiment_config(f"bench/{name}"), "cuda")
        return plan_sizes(cfg, torch.device("cuda"), h200)

    arm = experiment_config("bench/grpo_default")
    assert (arm.objective.generation_dtype, arm.objective.generation_batch_size) == (GenerationDtype.auto, "auto")
    assert (arm.trainer.compile, arm.optimizer.compile) == ("auto", "auto")
    default, sizes = on_h200("grpo_default")
    fastest, _ = on_h200("grpo_best")
    assert sizes["generation"]["dtype"]["resolved"] == "bf16" and sizes["generation"]["batch_size"]["resolved"] == 512
    assert (default.optimizer.compile, fastest.optimizer.compile) == (True, False)
    default = dataclasses.replace(default, optimizer=dataclasses.replace(default.optimizer, compile=False))
    for group in (f.name for f in dataclasses.fields(default)):
        assert getattr(default, group) == getattr(fastest, group), group
    bench, _ = on_h200("grpo_bench")
    o = bench.objective
    assert (o.generation_dtype, o.generation_batch_size, bench.trainer.compile) == (GenerationDtype.same, 256, False)


def test_the_grpo_default_arm_carries_no_performance_override():
    """grpo_default is `objective=grpo` on the bench's prompts, reward and rollout shape as a user types
    it: the sampler, attention, parallel and every engine and compile switch as GRPO's composition gives
    them (its padding levers live in conf/objective/grpo.yaml, not in the arm)."""
    from bench.common import compose_typed, experiment_config

    arm = experiment_config("bench/grpo_default")
    plain = compose_typed(["model=mistral", "objective=grpo", "data=gsm8k_prompts", "reward=gsm8k"])
    for group in ("sampler", "attention", "parallel"):
        assert getattr(arm, group) == getattr(plain, group), group
    assert (arm.sampler.mask_padding, arm.sampler.pad_to_multiple_of) == (False, 8)
    o = arm.objective
    assert (o.generation_dtype.value, o.generation_batch_size) == ("auto", "auto")
    assert (arm.trainer.compile, arm.optimizer.compile, arm.trainer.loss_chunk_tokens) == ("auto", "auto", "auto")


def test_useful_flops_of_a_lora_arm_count_the_frozen_base_without_weight_gradients():
    """A frozen base runs its forward and the input-gradient half of its backward (4N a token); only the
    adapters add weight gradients. Counted as full training (6N), the LoRA default's useful MFU read 1.5x
    its counted MFU."""
    lora = model_flops(compose_typed(["experiment=bench/gemma4_lora_default"]))
    full = model_flops(compose_typed(["experiment=bench/gemma4_lora_default", "model.lora.enabled=false"]))
    adapters = lora.params_active - full.params_active
    assert 0 < adapters == lora.params_active_trainable < 0.01 * full.params_active
    attention = full.per_token(1) - 6 * full.params_active
    assert full.params_active_trainable == full.params_active
    assert lora.per_token(1) == pytest.approx(4 * full.params_active + 6 * adapters + attention)
