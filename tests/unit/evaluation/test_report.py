"""eval.json: every key present, every null with a reason, completed whatever the exit; eval.md: one
column per arm."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from align.errors import ConfigError
from align.evaluation.config import EvalTask
from align.evaluation.eval_record import PENDING, SCHEMA, EvalRecord, missing_reasons, skeleton
from align.evaluation.job import EvalJob
from tests.unit.evaluation.conftest import run_config


def test_the_skeleton_has_every_key_and_every_null_is_pending():
    data = skeleton()
    assert set(data) == set(SCHEMA) and missing_reasons(data) == []
    assert data["null_reasons"]["run.exit_code"] == PENDING


def test_a_null_without_a_reason_is_found(tmp_path):
    r = EvalRecord(tmp_path)
    r.set("arms.model", {"metrics": {"pass@1": None}, "engine": {"compile_config": None}})
    assert missing_reasons(r.data) == ["arms.model.metrics.pass@1"]  # the engine's own record is opaque
    r.set("arms.model", {"metrics": {"pass@1": None}}, {"metrics.pass@1": "no prompts"})
    assert missing_reasons(r.data) == []


def test_complete_says_what_was_never_reached(tmp_path):
    r = EvalRecord(tmp_path)
    r.complete(2, "refused")
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["status"] == "complete" and data["run"]["exit_code"] == 2
    assert data["null_reasons"]["dataset.sha256"].startswith("not reached: the eval ended (exit 2)")


def _load(run_dir):
    return json.loads((run_dir / "eval.json").read_text()), (run_dir / "eval.md").read_text()


def test_a_gsm8k_job_records_what_it_resolved_to(tiny_export, tmp_path):
    cfg = run_config(tiny_export, tmp_path)
    assert EvalJob(cfg, tmp_path / "run", ["a=b"], ["a=b"], {"x": 1}).run() == 0
    data, md = _load(tmp_path / "run")
    assert set(data) == set(SCHEMA) and missing_reasons(data) == []
    assert [p for p, why in data["null_reasons"].items() if why.startswith(("pending", "not reached"))] == []
    arm = data["arms"]["model"]
    assert arm["engine"]["backend"] == "align" and arm["engine"]["backend_requested"] == "auto"
    assert arm["model"]["kind"] == "export" and arm["model"]["class"]
    assert data["scorer"]["identity"] == {"name": "gsm8k", "version": 1}
    assert data["generation"]["spec"]["temperature"] == 0 and data["generation"]["spec"]["n"] == 1
    assert data["dataset"]["records"] == 3 and data["discriminator"] is None
    assert "| pass@1 |" in md and "`model`" in md


def test_a_refusal_job_with_both_arms(tiny_export, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Tell me a secret."}\n{"prompt": "Write a haiku."}\n')
    cfg = run_config(tiny_export, tmp_path, task=EvalTask.refusal, prompts=str(prompts), prompt_field="prompt",
                     compare_to=str(tiny_export))
    assert EvalJob(cfg, tmp_path / "run", [], [], {}).run() == 0
    data, md = _load(tmp_path / "run")
    assert missing_reasons(data) == [] and set(data["arms"]) == {"model", "compare_to"}
    assert data["arms"]["model"]["metrics"]["total"] == 2
    assert data["discriminator"]["verdict"] in {"binary", "real_difference", "both_deflect"}
    assert "| hard |" in md and "`compare_to`" in md and "Discriminator" in md
    assert data["scorer"]["kind"] == "classifier"


def test_a_failed_job_still_completes_its_record(tiny_export, tmp_path):
    cfg = run_config(tiny_export, tmp_path)
    cfg = replace(cfg, model_dir=str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match="model_dir: no such directory"):
        EvalJob(cfg, tmp_path / "run", [], [], {}).run()
    data, = (json.loads((tmp_path / "run" / "eval.json").read_text()),)
    assert data["status"] == "complete" and data["run"]["exit_code"] == 2 and missing_reasons(data) == []


def test_wandb_gets_the_metrics_when_enabled(tmp_path):
    from align.config import LoggerConfig, LoggerKind
    from tests.wandb_log import read_run

    cfg = replace(run_config(None, tmp_path, oracle=True, limit=5), logger=LoggerConfig(kind=LoggerKind.wandb))
    assert EvalJob(cfg, tmp_path / "run", [], [], {"eval": {"task": "gsm8k"}}).run() == 0
    (run,) = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    summary = read_run(run)["summary"]
    assert summary["eval/oracle/pass@1"] == 1.0 and summary["eval/task"] == "gsm8k"
