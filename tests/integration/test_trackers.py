"""logger=tensorboard and logger=mlflow beside W&B: the rows history.jsonl holds, under W&B's keys and the
trainer's step, read back from what each tracker wrote (TensorBoard's EventAccumulator, MLflow's file store);
a resume continues them; the manifest names the tracker; a missing package is one line naming its extra."""

from __future__ import annotations

import json
import math

import pytest

from align.config import LoggerKind
from align.telemetry.trackers import scalar_row, wandb_row
from tests.conftest import recorded_run

RUN = ["data.max_records=16", "trainer.max_steps=3", "trainer.device=cpu"]


def history(run_dir) -> dict[str, dict[int, float]]:
    """{key: {step: value}} of the rows' numbers, as a scalar tracker keys them."""
    out: dict[str, dict[int, float]] = {}
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        row = {k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in row.items()}
        for k, v in scalar_row(row, step).items():
            out.setdefault(k, {})[step] = v
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_a_scalar_tracker_gets_the_wandb_rows_numbers_under_the_same_keys():
    metrics = {"loss": 1.5, "clipped": True, "skip_cause": None, "moe/l0/max_vio": 2.0, "reward/mean": 0.25,
               "rollout/weights_sha256": "ab12", "tokens": 7}
    row = wandb_row(metrics, 4)
    assert row == {"train/step": 4, "train/loss": 1.5, "train/clipped": True, "train/skip_cause": None,
                   "moe/l0/max_vio": 2.0, "reward/mean": 0.25, "rollout/weights_sha256": "ab12", "train/tokens": 7}
    assert scalar_row(metrics, 4) == {"train/loss": 1.5, "train/clipped": 1.0, "moe/l0/max_vio": 2.0,
                                      "reward/mean": 0.25, "train/tokens": 7.0}


@pytest.mark.parametrize("kind", [LoggerKind.tensorboard, LoggerKind.mlflow])
def test_a_missing_tracker_package_is_refused_in_preflight_and_at_build(kind, compose, monkeypatch):
    import align.telemetry.trackers as trackers
    from align.config import to_typed
    from align.errors import ConfigError
    from align.run.checklist import Status
    from align.run.preflight_checks import collect
    from align.telemetry.wandb_logger import build_logger

    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name, *a: None if name == kind.value
                        else real(name, *a))
    typed = to_typed(compose([f"logger={kind.value}", "allow_dirty=true"]))
    failed = [c for c in collect(typed, stop_on_fail=True).checks if c.status == Status.failed]
    why = f"logger={kind.value} needs the {kind.value} package, which is not installed: pip install align[{kind.value}]"
    assert (failed[0].name, failed[0].key, failed[0].detail) == ("logger", "logger", why)
    with pytest.raises(ConfigError, match=r"^logger: " + why.replace("[", r"\[").replace("]", r"\]")):
        build_logger(typed.logger, True, {"dir": ".", "name": "n", "config": {}})
    assert type(build_logger(typed.logger, False, {})).__name__ == "Logger"  # ranks > 0 log nothing


def test_the_manifest_names_the_tracker_that_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_ENTITY", "team-env")
    _, run_dir = recorded_run(tmp_path / "wandb", ["logger=wandb", *RUN, "trainer.max_steps=1",
                                                   "logger.entity=team-cfg"])
    m = json.loads((run_dir / "provenance.json").read_text())
    assert m["logger"]["kind"] == "wandb" and m["logger"]["mode"] == "offline"
    assert (m["logger"]["project"], m["logger"]["entity"]) == ("from-env", "team-cfg")  # the config wins where set
    assert m["logger"]["sources"] == {"project": "$WANDB_PROJECT", "entity": "logger.entity", "mode": "$WANDB_MODE"}
    assert m["logger"]["dir"].startswith(str(run_dir / "wandb" / "offline-run-"))
    _, run_dir = recorded_run(tmp_path / "none", [*RUN, "trainer.max_steps=1"])
    m = json.loads((run_dir / "provenance.json").read_text())
    assert m["logger"] is None and m["null_reasons"]["logger"] == "logger=none: history.jsonl only"


def test_tensorboard_holds_the_history_and_a_resume_continues_it(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def events(run_dir) -> dict[str, dict[int, float]]:
        ea = EventAccumulator(str(run_dir / "tensorboard"))
        ea.Reload()
        return {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}

    def float32(values: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
        import numpy as np

        return {k: {s: float(np.float32(v)) for s, v in steps.items()} for k, steps in values.items()}

    ov = ["logger=tensorboard", *RUN, "trainer.save_every=2"]
    _, run_dir = recorded_run(tmp_path, ov)
    want, got = float32(history(run_dir)), events(run_dir)
    assert set(got) == set(want) and "train/loss" in got and "train/step" not in got
    assert all(got[k].keys() == want[k].keys() and all(same(got[k][s], want[k][s]) for s in want[k]) for k in want)
    manifest = json.loads((run_dir / "provenance.json").read_text())
    assert manifest["logger"]["kind"] == "tensorboard" and manifest["logger"]["dir"] == str(run_dir / "tensorboard")
    # resumed from the step-2 checkpoint: step 3 is logged again, the first attempt's step 3 hidden
    _, run_dir = recorded_run(tmp_path, [*ov, "trainer.max_steps=4"])
    want, got = float32(history(run_dir)), events(run_dir)
    assert sorted(got["train/loss"]) == [1, 2, 3, 4] and set(got) == set(want)
    assert all(same(got[k][s], want[k][s]) for k in want for s in want[k])
    assert json.loads((run_dir / "provenance.json").read_text())["logger"]["purge_step"] == 3


def test_mlflow_holds_the_history_and_a_resume_continues_its_run(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    ov = ["logger=mlflow", *RUN, "trainer.save_every=2"]
    _, run_dir = recorded_run(tmp_path, ov)
    logged = json.loads((run_dir / "provenance.json").read_text())["logger"]
    client = MlflowClient(tracking_uri=logged["tracking_uri"])
    run = client.get_run(logged["run_id"])
    assert logged["mlflow"] == mlflow.__version__
    assert run.info.status == "FINISHED" and logged["tracking_uri"] == (run_dir / "mlruns").resolve().as_uri()
    want = history(run_dir)
    assert set(run.data.metrics) == set(want) and "train/step" not in run.data.metrics
    for k, steps in want.items():
        got = {m.step: m.value for m in client.get_metric_history(logged["run_id"], k)}
        assert got.keys() == steps.keys() and all(same(got[s], steps[s]) for s in steps), k
    _, run_dir = recorded_run(tmp_path, [*ov, "trainer.max_steps=4"])
    again = json.loads((run_dir / "provenance.json").read_text())["logger"]
    assert again["run_id"] == logged["run_id"]  # the same MLflow run, continued from the checkpoint
    losses = client.get_metric_history(logged["run_id"], "train/loss")
    latest = {m.step: m.value for m in sorted(losses, key=lambda m: m.timestamp)}
    assert sorted(latest) == [1, 2, 3, 4] and all(same(latest[s], v) for s, v in history(run_dir)["train/loss"].items())
