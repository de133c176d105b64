"""W&B, read back from the offline run logs: a multirun sweep runs one job per point, each with its
own run dir and its own W&B run (finished per job, grouped by sweep, named by its swept values); a
resumed run continues the same W&B run with its steps carrying on; the summary holds chartable
scalars; `logger.log_model=true` logs the export as a model artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.wandb_log import read_run

SCALAR = (int, float, str, bool, type(None))


def _history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def _wandb_runs(run_dir: Path) -> list[dict]:
    return [read_run(d) for d in sorted((run_dir / "wandb").glob("offline-run-*"))]


@pytest.mark.slow
def test_sweep_gives_each_job_its_own_run_dir_and_wandb_run(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_cli("align.train", "-m", "optimizer.lr=1e-4,3e-4", "trainer.max_steps=3", "data.max_records=100",
                "trainer.export=false", f"hydra.sweep.dir={sweep}", "allow_dirty=true")
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir() and d.name.isdigit())
    assert [d.name for d in jobs] == ["0", "1"]

    runs = []
    for job, lr in zip(jobs, ("0.0001", "0.0003")):  # as Hydra writes the swept values
        rows = _history(job)
        assert [r["step"] for r in rows] == [1, 2, 3]
        (run,) = _wandb_runs(job)
        runs.append(run)
        assert run["run"]["group"] == sweep.name
        assert run["run"]["name"] == f"optimizer.lr={lr}"  # what the job is, not its number
        assert run["config"]["optimizer"]["lr"] == float(lr)  # each job logged its own config, not job 0's
        assert isinstance(run["config"]["model"], dict) and run["config"]["model"]["family"] == "mistral"
        logged = [h for h in run["history"] if "train/loss" in h]
        assert [h["train/step"] for h in logged] == [1, 2, 3]
        assert [h["train/loss"] for h in logged] == pytest.approx([r["loss"] for r in rows])
        assert any(m["step_metric"] == "train/step" for m in run["metrics"])
        assert run["summary"]["steps"] == 3
    assert runs[0]["run"]["id"] != runs[1]["run"]["id"]


def _fit(run_dir: Path, *overrides: str) -> None:
    from align.config import to_typed
    from align.run.cli import compose
    from align.trainer import Trainer

    typed = to_typed(compose(["allow_dirty=true", "data.max_records=24", "trainer.save_every=2", *overrides]))
    assert Trainer.build(typed, run_dir, {"note": "in-process"}).fit() == 0


def test_a_resumed_run_continues_its_wandb_run_and_logs_the_export_as_a_model(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    _fit(run_dir, "trainer.max_steps=2", "trainer.export=false")
    _fit(run_dir, "trainer.max_steps=4", "logger.log_model=true")  # resumes from the step-2 checkpoint
    assert [r["step"] for r in _history(run_dir)] == [1, 2, 3, 4]

    a, b = _wandb_runs(run_dir)
    assert a["run"]["id"] == b["run"]["id"] == (run_dir / "wandb" / "align_run_id").read_text().strip()
    assert [h["train/step"] for h in a["history"] if "train/loss" in h] == [1, 2]
    assert [h["train/step"] for h in b["history"] if "train/loss" in h] == [3, 4]  # steps carry on

    # the summary: scalars only, `loss` the final loss (the loss function's settings flattened under loss/)
    assert all(isinstance(v, SCALAR) for k, v in b["summary"].items() if not k.startswith("_")), b["summary"]
    assert b["summary"]["loss"] == pytest.approx(_history(run_dir)[-1]["loss"]) and b["summary"]["steps"] == 4
    assert b["summary"]["loss/kind"] == "ce"

    assert a["artifacts"] == []  # log_model is off by default
    (art,) = b["artifacts"]
    assert art["type"] == "model" and art["name"] == f"run-{b['run']['id']}-model"
    assert set(art["aliases"]) >= {"latest", "step-4"} and art["metadata"]["step"] == 4
    assert {"config.json", "model.safetensors"} <= set(art["paths"]), art["paths"]
