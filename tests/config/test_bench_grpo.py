"""The GRPO bench on the CPU: its arms resolve with no data file to write (the bundled GSM8K prompts),
TRL's arm and align's read the same tiny preset; an align GRPO history gives samples/s, the generation
share and rollout/update tokens/s, GRPO arms compare in samples/s in a table of their own; TRL's
GRPOConfig kwargs are names the installed TRL accepts and resolve to one optimizer step per generation
of 64 x 8 completions; a tiny run of both arms goes through the harness."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from bench import grpo_rows, trl_grpo
from bench import run as harness
from bench.common import TINY_GRPO, add_ratios, experiment_config, grpo_measurement, summarise


def test_grpo_arms_write_no_data_and_share_the_tiny_rollout(out, capsys):
    assert harness.main(["--dry-run", "--tiny", "trl_grpo", "grpo_bench", "grpo_best", "--hf-steps", "3",
                         "--hf-warmup", "1", "--steps", "3", "--warmup", "1"]) == 0
    cmds = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert "data.path" not in cmds["grpo_bench"] and "--pairs-file" not in cmds["trl_grpo"]
    assert all(o in cmds["grpo_best"] for o in TINY_GRPO) and cmds["trl_grpo"].endswith("--tiny")
    assert not out.exists()
    typed = experiment_config(trl_grpo.EXPERIMENT, tiny=True)  # what the TRL arm builds with --tiny
    assert (typed.objective.prompts_per_rollout, typed.objective.group_size) == (4, 4)


def _write_grpo_run(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    rows = [{"elapsed_s": 2.0 * i, "real_tokens": 3000, "tokens": 3200, "mem_peak_gib": 30.0 + i, "loss": 0.0,
             "rollout/sequences": 8, "rollout/tokens": 2000, "rollout/stop_frac": 0.25, "time/generation_s": 1.0,
             "time/sync_s": 0.1, "time/scoring_s": 0.1, "time/old_logps_s": 0.0, "time/reference_s": 0.0}
            for i in range(1, 5)]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "provenance.json").write_text(json.dumps({"model": {}, "objective": {"loss": {"engine": {
        "mode": "compiled", "batch_size": 8}}}}))


def test_a_grpo_history_gives_samples_per_s_generation_share_and_token_rates(tmp_path):
    _write_grpo_run(tmp_path / "g")
    g = summarise(grpo_rows.read_grpo_run("grpo_x", tmp_path / "g", warmup=1, gpus=1), None)
    assert (g["seconds"], g["samples"], g["peak_mem_gib"]) == (6.0, 24, 34.0)
    assert g["samples_per_s"] == pytest.approx(4.0) and g["generation_share"] == pytest.approx(0.5)
    assert g["rollout_tokens_per_s"] == pytest.approx(2000.0)  # completion tokens per generation second
    assert g["update_tokens_per_s"] == pytest.approx(9000 / (6.0 - 3 * 1.2))  # the step outside its rollout phase
    assert (g["completion_len_mean"], g["stop_frac"]) == (250.0, 0.25)
    trl = summarise(grpo_measurement("trl_grpo", [4.0, 4.0], [3.0, 3.0], [3.1, 3.1],
                                     [{"samples": 8, "completion_tokens": 2000, "prompt_tokens": 1000,
                                       "stopped": 0}] * 2, 40.0), None)
    sft = summarise(dict(arm="sft", seconds=1.0, steps_measured=1, real_tokens=2000, tokens=2000,
                         counted_flops=None, useful_flops=0.0, peak_mem_gib=None), None)
    failed = {"arm": "grpo_best", "error": "exit 1: boom", "grpo": True}
    results = [trl, g, sft, failed]
    add_ratios(results, ["trl_grpo"])
    assert g["vs_trl_grpo"] == pytest.approx(2.0)  # samples/s 4 / 2 (real tokens/s would say 0.75)
    grpo_rows.add_engine_ratios(results, {"grpo_x": {"generated_tokens_per_s": 4000.0}})
    assert g["vs_engine_eval"] == pytest.approx(0.5)
    md = harness.table(results, None, ["trl_grpo"])
    main, grpo = md.split("| arm | samples/s |")
    assert "(1) sft" in main and "grpo_x" not in main and "grpo_best" not in main
    assert "| (2) grpo_x | 4.0 | 50.0% | 2,000 |" in grpo and "0.50x" in grpo and "engine mode=compiled" in grpo
    assert "grpo_best" in grpo and "boom" in grpo


def test_a_history_without_rollout_timers_is_refused(tmp_path):
    _write_grpo_run(tmp_path / "g")
    h = tmp_path / "g" / "history.jsonl"
    h.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "time/generation_s"}) + "\n"
                         for line in h.read_text().splitlines()))
    with pytest.raises(KeyError, match="time/generation_s"):
        grpo_rows.read_grpo_run("grpo_x", tmp_path / "g", warmup=1, gpus=1)


def test_trl_grpo_config_is_one_optimizer_step_per_generation_of_the_rollout(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from align.core.signatures import check_kwargs

    typed = experiment_config(trl_grpo.EXPERIMENT)
    for cuda in (True, False):
        check_kwargs(GRPOConfig.__init__, trl_grpo.grpo_config_kwargs(typed, str(tmp_path), 3, cuda), "GRPOConfig")
    cfg = GRPOConfig(**trl_grpo.grpo_config_kwargs(typed, str(tmp_path), 3, cuda=False))  # needs no GPU
    assert (cfg.generation_batch_size, cfg.num_generations, cfg.max_completion_length) == (512, 8, 256)
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == typed.trainer.grad_accum == 16
    assert cfg.per_device_train_batch_size == 32 and cfg.num_iterations == 1 and cfg.beta == 0.0
    assert cfg.use_vllm is False and cfg.gradient_checkpointing is False
    trl_grpo.check_rollout_shape(cfg, typed)
    # TRL checkpoints activations unless told otherwise; the phases the arm times are these methods
    assert GRPOConfig.__dataclass_fields__["gradient_checkpointing"].default is True
    assert {"_generate_single_turn", "_generate_and_score_completions"} <= set(vars(GRPOTrainer))
    src = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "steps_per_generation * self.num_iterations" in src  # one generation per steps_per_generation steps


@pytest.mark.slow
def test_tiny_grpo_arms_run_through_the_harness(out):
    rc = harness.main(["--tiny", "trl_grpo", "grpo_bench", "--steps", "2", "--warmup", "1", "--hf-steps", "2",
                       "--hf-warmup", "1"])
    rows = {a: json.loads((out / f"{a}.json").read_text()) for a in ("trl_grpo", "grpo_bench")}
    assert rc == 0, {a: r.get("error") for a, r in rows.items()}
    for r in rows.values():
        assert r["samples"] == 16 and r["samples_per_s"] > 0 and 0 < r["generation_share"] < 1
        assert r["completion_len_mean"] <= 16 and r["update_tokens_per_s"] > 0
    ratios = {r["arm"]: r.get("vs_trl_grpo") for r in json.loads((out / "bench.json").read_text())["results"]}
    assert ratios["trl_grpo"] == pytest.approx(1.0) and ratios["grpo_bench"] > 0
    assert "| generation share |" in (out / "bench.md").read_text()
