"""A multirun sweep runs one job per point, each with its own run dir and its own offline W&B run
(finished per job, grouped by sweep), and the metrics read back from the W&B log."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.wandb_log import read_run


@pytest.mark.slow
def test_sweep_gives_each_job_its_own_run_dir_and_wandb_run(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_cli("align.train", "-m", "optimizer.lr=1e-4,3e-4", "trainer.max_steps=3", "data.max_records=100",
                "trainer.export=false", f"hydra.sweep.dir={sweep}", "allow_dirty=true")
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir() and d.name.isdigit())
    assert [d.name for d in jobs] == ["0", "1"]

    runs = []
    for job, lr in zip(jobs, (1e-4, 3e-4)):
        rows = [json.loads(line) for line in (job / "history.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 3]
        (wb_dir,) = list((job / "wandb").glob("offline-run-*"))
        run = read_run(wb_dir)
        runs.append(run)
        assert run["run"]["group"] == sweep.name
        assert run["config"]["optimizer"]["lr"] == lr  # each job logged its own config (LANDMINES 14)
        assert isinstance(run["config"]["model"], dict) and run["config"]["model"]["family"] == "mistral"
        logged = [h for h in run["history"] if "train/loss" in h]
        assert [h["train/step"] for h in logged] == [1, 2, 3]
        assert [h["train/loss"] for h in logged] == pytest.approx([r["loss"] for r in rows])
        assert {"name": "", "step_metric": "train/step"} in run["metrics"] or any(
            m["step_metric"] == "train/step" for m in run["metrics"])
        assert run["summary"]["steps"] == 3
    assert runs[0]["run"]["id"] != runs[1]["run"]["id"]
