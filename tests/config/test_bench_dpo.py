"""The DPO bench on the CPU: the pair files are deterministic, about a thousand tokens a pair and the
very sequences align's preference pipeline encodes; the harness resolves the DPO, TRL and SFT-on-pairs
arms to the files they read, counts pairs, compares DPO arms in pairs/s and keeps its deadline; the TRL
arm's kwargs are names the installed TRL accepts; the suite's commands validate; the summary reads the
targets off the arms; tiny runs of one align DPO arm and of the TRL arm complete."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from bench import pairs as bench_pairs
from bench import run as harness
from bench import suite_summary, trl_arm
from bench.common import add_ratios, experiment_config, summarise
from tests.config.conftest import dry_run
from tests.conftest import REPO

# ------------------------------------------------------------------------------------- the pairs


def test_pairs_are_deterministic_three_questions_and_other_solutions(tmp_path):
    first, again = bench_pairs.build_pairs(50), bench_pairs.build_pairs(50)
    assert first == again
    triples = bench_pairs.gsm8k_triples()
    p = first[7]
    assert p["prompt"] == "\n\n".join(r["question"] for r in triples[7])
    assert p["chosen"] == "\n\n".join(r["answer"] for r in triples[7])
    assert p["rejected"] == "\n\n".join(r["answer"] for r in triples[7 + len(triples) // 2])
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    bench_pairs.write_bench_data(a, 50)
    bench_pairs.write_bench_data(b, 50)
    for name in (bench_pairs.PAIRS_FILE, bench_pairs.PAIR_ROWS_FILE):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    with pytest.raises(ValueError, match="accepted 1.."):
        bench_pairs.build_pairs(len(triples) + 1)


def test_a_pair_is_about_a_thousand_tokens_as_a_trainer_forwards_it(tmp_path):
    stats = bench_pairs.write_bench_data(tmp_path, 1024, [bench_pairs.PAIRS_FILE])
    # the "about 970 tokens per pair"; the bundled tokenizer gives 983 over the suite's 1024
    assert 930 <= stats["tokens_per_pair"] <= 1030
    assert len(stats["sequence_lengths"]) == 2048
    assert stats["longest_sequence"] <= experiment_config("bench/base_dpo").data.max_seq_len  # nothing truncated


def test_pair_rows_are_the_sequences_the_dpo_pipeline_encodes(tmp_path, tokenizer):
    from align.data.preference import load_pairs
    from bench.common import compose_typed

    bench_pairs.write_bench_data(tmp_path, 24)
    typed = compose_typed(["experiment=bench/dpo_ref_model", f"data.path={tmp_path / 'pairs.jsonl'}",
                           f"data.cache_dir={tmp_path / 'cache'}"])
    encoded = load_pairs(typed, tokenizer)
    rows = [json.loads(line) for line in (tmp_path / "pair_rows.jsonl").read_text().splitlines()]
    assert encoded.pairs == 24 and len(rows) == 48
    for i, row in enumerate(rows):
        a, b = encoded.offsets[i], encoded.offsets[i + 1]
        assert row["input_ids"] == encoded.tokens[a:b].tolist()
        assert row["loss_mask"] == encoded.loss_mask[a:b].astype(int).tolist()


# ------------------------------------------------------------------------------------ the harness


@pytest.mark.parametrize("name", ["trl_dpo_ref", "trl_dpo_precomputed", "dpo_best", "dpo_trl_shape", "sft_pairs_best"])
def test_the_new_arms_resolve(name):
    arm = harness.resolve(name)
    assert arm.name == name and (arm.experiment is None) == name.startswith("trl_")


def test_each_arm_reads_the_file_its_experiment_names(out, capsys):
    cmds = dry_run(capsys, "trl_dpo_ref", "dpo_best", "sft_pairs_best", "dense_eager", "hf_padded",
                   "--hf-steps", "20", "--hf-warmup", "5")
    assert f"bench/trl_arm.py --arm trl_dpo_ref --steps 20 --warmup 5 --pairs-file {out}/pairs.jsonl" \
           in cmds["trl_dpo_ref"]
    assert f"experiment=bench/dpo_best data.path={out}/pairs.jsonl " in cmds["dpo_best"]
    assert f"data.path={out}/pair_rows.jsonl " in cmds["sft_pairs_best"]
    assert f"data.path={out}/rows.jsonl " in cmds["dense_eager"]
    assert f"--rows-file {out}/rows.jsonl" in cmds["hf_padded"]
    assert not out.exists()


def test_an_experiment_whose_data_is_no_bench_file_exits_2(out, capsys):
    a = harness.parse_args(["smoke"])
    with pytest.raises(SystemExit) as e:
        harness.plan_align(harness.Arm("smoke", "smoke"), a, out)
    assert e.value.code == 2 and "names no file the harness writes" in capsys.readouterr().err


def test_too_many_pairs_exits_2_before_any_run(out, capsys):
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "dpo_best", "--pairs", "100000"])
    assert e.value.code == 2 and "--pairs 100000: accepted 1.." in capsys.readouterr().err
    assert not out.exists()


def test_trl_arms_need_enough_pairs_for_their_steps(out, capsys):
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "trl_dpo_ref", "--hf-steps", "20", "--hf-warmup", "5", "--pairs", "100"])
    assert e.value.code == 2 and "accepted: --pairs >= 160" in capsys.readouterr().err


def _write_dpo_run(run_dir: Path, pairs_per_step: int) -> None:
    run_dir.mkdir(parents=True)
    rows = [dict(elapsed_s=float(i), real_tokens=1000, tokens=1100, model_flops=1e12, step_time_s=1.0, loss=0.69,
                 mem_peak_gib=20.0, mem_alloc_retries=0, pairs=pairs_per_step) for i in range(1, 5)]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prov = {"model": {}, "objective": {"reference": {"resolved": "model"}}}
    (run_dir / "provenance.json").write_text(json.dumps(prov))


def test_a_dpo_run_counts_pairs_and_dpo_arms_compare_in_pairs_per_s(tmp_path):
    arm = harness.Arm("dpo_x", "bench/dpo_ref_model", run_dir=tmp_path / "dpo_x", data_file="pairs.jsonl")
    _write_dpo_run(arm.run_dir, pairs_per_step=24)
    m = harness.read_align_run(arm, warmup=1, useful_per_token=1.0)
    assert (m["pairs"], m["reference"], m["seconds"]) == (72, "model", 3.0)
    dpo = summarise(m, None)
    assert dpo["pairs_per_s"] == 24.0
    trl = summarise(dict(arm="trl_dpo_ref", seconds=2.0, steps_measured=2, real_tokens=4000, tokens=5000,
                         counted_flops=None, useful_flops=0.0, peak_mem_gib=None, pairs=16), None)
    sft = summarise(dict(arm="sft", seconds=1.0, steps_measured=1, real_tokens=2000, tokens=2000, counted_flops=None,
                         useful_flops=0.0, peak_mem_gib=None), None)
    results = [trl, dpo, sft]
    add_ratios(results, ["trl_dpo_ref"])
    assert dpo["vs_trl_dpo_ref"] == pytest.approx(3.0)  # pairs/s: 24 / 8 (real tokens/s would say 0.5)
    assert sft["vs_trl_dpo_ref"] == pytest.approx(1.0)  # no pairs on one side: real tokens/s, 2000 / 2000
    md = harness.table(results, None, ["trl_dpo_ref"])
    assert "| arm | pairs/s | real tok/s |" in md and "| (2) dpo_x | 24.0 | 1,000 |" in md
    assert "reference=model" in md


def test_no_arm_starts_after_the_deadline(out):
    a = harness.parse_args(["dense_eager", "--deadline", "5"])
    a.started = time.time() - 10
    r = harness.measure(harness.Arm("dense_eager", "bench/dense_eager"), a, out, {}, harness.Data(), None)
    assert r["error"].startswith("not run: --deadline 5s had passed")


def test_an_arm_past_the_deadline_is_killed_with_its_process_group(tmp_path):
    marker = tmp_path / "child.pid"
    script = f"import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; " \
             f"time.sleep(60)']); open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    t0 = time.time()
    rc = harness.run_logged([sys.executable, "-c", script], tmp_path / "log", dict(os.environ), timeout=3)
    assert rc is None and time.time() - t0 < 30
    child = int(marker.read_text())
    time.sleep(0.5)
    assert not _alive(child), "the arm's own child outlived the deadline"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


def test_a_failed_arm_names_its_error_not_hydras_hint(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("Traceback ...\nImportError: cannot import name 'x'\n\n"
                   "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert harness.last_words(log) == "ImportError: cannot import name 'x'"


# -------------------------------------------------------------------------------------- TRL's arm


@pytest.mark.parametrize("arm", sorted(trl_arm.ARMS))
def test_trl_kwargs_are_names_the_installed_trl_accepts(arm, tmp_path):
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    from align.core.signatures import check_kwargs

    typed = experiment_config(trl_arm.EXPERIMENT)
    for cuda in (True, False):
        check_kwargs(DPOConfig.__init__, trl_arm.dpo_config_kwargs(arm, typed, str(tmp_path), 20, cuda), "DPOConfig")
    cfg = DPOConfig(**trl_arm.dpo_config_kwargs(arm, typed, str(tmp_path), 20, cuda=False))  # needs no GPU
    assert cfg.per_device_train_batch_size == trl_arm.PAIRS_PER_STEP and cfg.max_length == typed.data.max_seq_len
    assert cfg.activation_checkpointing is trl_arm.ARMS[arm].checkpointing
    assert cfg.precompute_ref_log_probs is trl_arm.ARMS[arm].precompute
    names = dict(model=None, ref_model=None, args=None, data_collator=None, train_dataset=None, processing_class=None,
                 callbacks=None)
    check_kwargs(DPOTrainer.__init__, names, "DPOTrainer")


def test_what_the_trl_settings_rely_on_still_holds_in_the_installed_trl():
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    # TRL checkpoints activations unless told otherwise: the arms say False (align never recomputes)
    assert DPOConfig.__dataclass_fields__["gradient_checkpointing"].default is True
    # padding_free falls back to padding in this TRL: when it returns, the arms should use it
    assert "self.padding_free = False" in inspect.getsource(DPOTrainer.__init__)


def test_tiny_trl_arm_runs_on_the_cpu_with_align_s_model_and_tokens(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    short = [{"prompt": p["prompt"][:80], "chosen": p["chosen"][:60], "rejected": p["rejected"][:60]}
             for p in bench_pairs.build_pairs(24)]
    bench_pairs.write_pairs(pairs, short)
    m_file = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "trl_arm.py"), "--arm", "trl_dpo_precomputed",
                           "--steps", "3", "--warmup", "1", "--pairs-file", str(pairs), "--out", str(m_file),
                           "--tiny"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads(m_file.read_text())
    assert (m["steps_measured"], m["pairs"]) == (2, 16) and m["real_tokens"] > 0
    assert m["tokens_match_align"] is True
    assert m["trl"]["precompute_ref_log_probs"] is True and m["trl"]["trainer_padding_free"] is False
    # the policy is align's: the same weights as align's tiny DPO model at the same seed
    from align.objectives.reference import weights_sha256
    from tests.conftest import bundled_tokenizer

    typed = experiment_config(trl_arm.EXPERIMENT, tiny=True)
    assert m["weights_sha256"] == weights_sha256(trl_arm.build_policy(typed, bundled_tokenizer(),
                                                                      trl_arm.device_of(typed)))


def test_tiny_align_dpo_arm_runs_through_the_harness(out):
    rc = harness.main(["--tiny", "dpo_ref_model", "--steps", "2", "--warmup", "1", "--pairs", "4"])
    r = json.loads((out / "dpo_ref_model.json").read_text())
    assert rc == 0, r.get("error")
    assert r["pairs_per_s"] > 0 and r["pairs"] > 0 and r["reference"] == "model"
    assert "| pairs/s |" in (out / "bench.md").read_text()


# ----------------------------------------------------------------------------- the suite, its summary


def test_the_suite_validates_every_arm_it_runs(tmp_path):
    env = {**os.environ, "SUITE_DRY_RUN": "1", "SUITE_WORK": str(tmp_path / "work"), "PYTHON": sys.executable,
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_suite.sh"), str(tmp_path / "dest")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for arm in ("trl_dpo_ref", "trl_dpo_precomputed", "dpo_best", "dpo_best_ref", "dpo_trl_shape", "sft_pairs_best",
                "dpo_ref_model", "dpo_precomputed"):
        assert f"\n{arm}: " in proc.stdout, arm
    arms = "plain_dynamic, engine_dynamic, engine_static, engine_compiled, align_eager, align_graphs"
    assert f"generation: arms {arms}; 64 prompts x 128" in proc.stdout
    assert not (tmp_path / "dest" / "summary.md").exists()


def _fake_work(work: Path, dpo: list[dict], gen: list[dict]) -> None:
    (work / "dpo" / "runs" / "dpo_best").mkdir(parents=True)
    (work / "dpo" / "runs" / "dpo_best" / "history.jsonl").write_text("{}\n")
    (work / "dpo" / "dpo_best.json").write_text("{}")
    (work / "dpo" / "bench.json").write_text(json.dumps({"results": dpo, "pairs": 1024}))
    (work / "dpo" / "bench.md").write_text("| dpo table |\n")
    (work / "generation").mkdir()
    (work / "generation" / "generation.json").write_text(json.dumps({"setup": {"prompts": 64}, "results": gen}))
    (work / "generation" / "generation.md").write_text("| generation table |\n")


def test_the_summary_reads_each_target_off_the_arms(tmp_path):
    dpo = [dict(arm="trl_dpo_ref", pairs_per_s=10.0, real_tokens_per_s=9700.0, peak_mem_gib=40.0),
           dict(arm="trl_dpo_precomputed", pairs_per_s=20.0, peak_mem_gib=30.0),
           dict(arm="dpo_best", pairs_per_s=60.0, real_tokens_per_s=59000.0, reference="precomputed"),
           dict(arm="dpo_best_ref", pairs_per_s=45.0, real_tokens_per_s=44000.0, reference="model"),
           dict(arm="dpo_trl_shape", pairs_per_s=30.0, real_tokens_per_s=29000.0, peak_mem_gib=44.0,
                reference="model"),
           dict(arm="dpo_adapters_off", pairs_per_s=500.0, reference="adapters_off"),
           dict(arm="sft_pairs_best", real_tokens_per_s=80000.0)]
    gen = [dict(arm="plain_dynamic", samples_per_s=10.0), dict(arm="engine_compiled", samples_per_s=26.0),
           dict(arm="engine_static", error="boom")]
    _fake_work(tmp_path / "work", dpo, gen)
    assert suite_summary.main([str(tmp_path / "work"), str(tmp_path / "dest")]) == 0
    rows = {r["target"].split(":")[0] + str(i): r
            for i, r in enumerate(json.loads((tmp_path / "dest" / "summary.json").read_text())["targets"])}
    got = [(r["ratio"], r["verdict"]) for r in rows.values()]
    # best align arm 60 pairs/s (the LoRA arm trains something else and is not held): 6x and 3x;
    # memory 44 vs 40 GiB; live reference 44k vs SFT 80k; compiled engine 26 vs 10
    assert got == [(6.0, "met"), (3.0, "NOT met"), (1.1, "NOT met"), (0.55, "NOT met"), (2.6, "met")]
    md = (tmp_path / "dest" / "summary.md").read_text()
    assert "dpo_best 60.0 / trl_dpo_ref 10.0" in md and "| dpo table |" in md and "| generation table |" in md
    with tarfile.open(tmp_path / "dest" / "arms.tar.gz") as tar:
        assert {"dpo/dpo_best.json", "dpo/bench.json", "dpo/runs/dpo_best/history.jsonl"} <= set(tar.getnames())


def test_a_target_whose_arms_did_not_run_is_not_measured(tmp_path):
    _fake_work(tmp_path / "work", [dict(arm="trl_dpo_ref", error="exit 1: no trl")], [])
    assert suite_summary.main([str(tmp_path / "work"), str(tmp_path / "dest")]) == 0
    targets = json.loads((tmp_path / "dest" / "summary.json").read_text())["targets"]
    assert {t["verdict"] for t in targets} == {"not measured"}


def test_the_summary_of_nothing_exits_2(tmp_path):
    assert suite_summary.main([str(tempfile.mkdtemp(dir=tmp_path)), str(tmp_path / "dest")]) == 2
