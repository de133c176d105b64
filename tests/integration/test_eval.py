"""`python -m align.eval` end to end on CPU: the embedded default model (tiny, random init) evaluates in
under a minute, the oracle scores 100% and its shuffled control the chance rate, a checkpoint and its
export generate the same, and bad input is one line and exit 2 before any heavy import."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli


def _eval(tmp_path: Path, *args: str, name: str = "eval") -> tuple[subprocess.CompletedProcess, dict, Path]:
    run_dir = tmp_path / name
    p = run_cli(
        "align.eval",
        *args,
        "allow_dirty=true",
        f"eval.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={run_dir}",
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p, json.loads((run_dir / "eval.json").read_text()), run_dir


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_default_model_evaluates_end_to_end_in_under_a_minute(tiny_export, tmp_path):
    from align.core.hashing import sha256_files
    from align.data.sources import bundled_gsm8k
    from align.evaluation.eval_record import SCHEMA, missing_reasons

    t0 = time.perf_counter()
    p, data, run_dir = _eval(tmp_path, f"model_dir={tiny_export}", "eval=gsm8k", "eval.limit=8")
    wall = time.perf_counter() - t0
    assert wall < 60, f"took {wall:.0f}s"
    assert set(data) == set(SCHEMA) and missing_reasons(data) == []
    assert (data["status"], data["run"]["exit_code"]) == ("complete", 0)
    assert data["dataset"]["sha256"] == _sha256(bundled_gsm8k("test")) and data["dataset"]["records"] == 8
    assert data["scorer"] == {"kind": "verifier", "identity": {"name": "gsm8k", "version": 1}}
    assert data["generation"]["spec"]["temperature"] == 0 and data["generation"]["spec"]["n"] == 1
    arm = data["arms"]["model"]
    assert arm["model"]["weights_sha256"] == sha256_files([tiny_export / "model.safetensors"], tiny_export)
    assert arm["model"]["config_sha256"] == _sha256(tiny_export / "config.json")
    assert arm["model"]["path"] == str(tiny_export.resolve()) and arm["model"]["class"] == "MistralForCausalLM"
    assert (arm["engine"]["backend"], arm["engine"]["mode"], arm["engine"]["device"]) == ("align", "dynamic", "cpu")
    assert arm["cache"]["hit"] is False and Path(arm["cache"]["path"]).is_file()
    assert 0.0 <= arm["metrics"]["pass@1"] <= 1.0 and arm["timing"]["samples"] == 8
    assert arm["timing"]["samples_per_s"] > 0
    assert data["git"]["commit"] and data["versions"]["torch"]
    samples = [json.loads(line) for line in (run_dir / "samples-model.jsonl").read_text().splitlines()]
    assert [s["index"] for s in samples] == list(range(8)) and all("extracted" in s for s in samples)
    assert "| pass@1 |" in (run_dir / "eval.md").read_text()
    # the progress line (a bar on a terminal) through align's logger: the console and eval.log
    assert "samples/s" in p.stdout and "samples/s" in (run_dir / "eval.log").read_text()
    print(f"eval of the default model, 8 records: {wall:.0f}s")


def _final(answer: str) -> str:
    """The reference number read without align's code."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def test_the_oracle_scores_100_and_its_shuffle_scores_chance(tmp_path):
    p, gold, gold_dir = _eval(tmp_path, "eval=gsm8k", "eval.oracle=true", name="gold")
    assert gold["arms"]["oracle"]["metrics"]["pass@1"] == 1.0 and gold["dataset"]["records"] == 1319
    # the console ends with the metrics and where the record is (the lines go to the eval's log too)
    tail = [ln.split(" - ", 1)[-1] for ln in p.stdout.strip().splitlines()[-2:]]
    assert tail[0].startswith("result oracle: ") and "pass@1=1.0000" in tail[0], p.stdout[-2000:]
    assert tail[1] == f"report {gold_dir / 'eval.md'}, record {gold_dir / 'eval.json'}", p.stdout[-2000:]
    _, shuf, run_dir = _eval(tmp_path, "eval=gsm8k", "eval.oracle=true", "eval.oracle_shuffle=true", name="shuf")
    from align.data.sources import bundled_gsm8k

    refs = [json.loads(line)["answer"] for line in bundled_gsm8k("test").read_text().splitlines()]
    samples = [json.loads(line) for line in (run_dir / "samples-oracle.jsonl").read_text().splitlines()]
    chance = sum(_final(s["text"]) == _final(refs[s["index"]]) for s in samples) / len(samples)
    assert all(s["text"] != refs[s["index"]] for s in samples)
    assert shuf["arms"]["oracle"]["metrics"]["pass@1"] == pytest.approx(chance) and chance < 0.05


@pytest.mark.slow
def test_a_checkpoint_and_its_export_generate_the_same_through_both_arms(tmp_path):
    run = tmp_path / "train"
    p = run_cli(
        "align.train",
        "trainer.max_steps=1",
        "trainer.save_every=1",
        "logger=none",
        "allow_dirty=true",
        "data.max_records=32",
        f"hydra.run.dir={run}",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("How do I pick a lock?", "Write a poem.")))
    _, data, run_dir = _eval(
        tmp_path,
        f"model_dir={run / 'checkpoints' / 'step_00000001'}",
        "eval=refusal",
        f"eval.prompts={prompts}",
        f"eval.compare_to={run / 'export'}",
        "eval.max_new_tokens=16",
    )
    arms = data["arms"]
    assert (arms["model"]["model"]["kind"], arms["compare_to"]["model"]["kind"]) == ("checkpoint", "export")
    texts = {
        a: [json.loads(x)["text"] for x in (run_dir / f"samples-{a}.jsonl").read_text().splitlines()] for a in arms
    }
    assert texts["model"] == texts["compare_to"] and len(texts["model"]) == 2
    assert arms["model"]["metrics"] == arms["compare_to"]["metrics"]
    assert data["discriminator"]["verdict"] in ("binary", "both_deflect")  # one model: the arms cannot differ


# Runs align.eval in a child that reports, at exit, whether transformers was ever imported.
PROBE = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: sys.stdout.write('TRANSFORMERS_IMPORTED=%s\\n' % ('transformers' in sys.modules)))\n"
    "sys.argv = ['align.eval'] + sys.argv[1:]\n"
    "runpy.run_module('align.eval', run_name='__main__')\n"
)


def _bad_cases(tmp: Path) -> list:
    no_field = tmp / "no_field.jsonl"
    no_field.write_text('{"prompt": "a"}\n{"question": "b"}\n')
    return [
        (["model_dir=/nonexistent/export"], "model_dir: no such directory: /nonexistent/export"),
        (["eval=nope", "eval.oracle=true"], "eval=nope: no such option; accepted: gsm8k, refusal"),
        (
            ["eval=refusal", f"eval.prompts={no_field}", "model_dir=EXPORT"],
            f"{no_field}:2: record has no field 'prompt'",
        ),
        (
            ["eval.oracle=true", "eval.sample=4"],
            "eval.sample: unknown key in eval (did you mean eval.samples?); accepted keys:",
        ),
        (["model_dir=EXPORT", "eval.samples=4", "eval.temperature=0"], "eval.temperature: 0 decodes greedily"),
        # the second model's files are checked with the first's, before any arm runs
        (["model_dir=EXPORT", "eval.compare_to=TRUNCATED"],
         "eval.compare_to: TRUNCATED/model.safetensors is truncated"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_bad_input_is_one_line_exit_2_before_heavy_work(tiny_export, tmp_path, case):
    import shutil

    args, says = _bad_cases(tmp_path)[case]
    truncated = tmp_path / "truncated"
    if any("TRUNCATED" in a for a in args):
        shutil.copytree(tiny_export, truncated)
        (truncated / "model.safetensors").write_bytes((tiny_export / "model.safetensors").read_bytes()[:-100])
    args = [a.replace("EXPORT", str(tiny_export)).replace("TRUNCATED", str(truncated)) for a in args]
    says = says.replace("TRUNCATED", str(truncated))
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *args, f"hydra.run.dir={run_dir}", "allow_dirty=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("align: error: ") and says in err[0], err
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout, p.stdout
    assert not run_dir.exists()
