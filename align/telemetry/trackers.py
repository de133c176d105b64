"""The trackers a run logs to beside history.jsonl, rank 0 only (logger=wandb in align/telemetry/wandb_logger.py,
logger=tensorboard and logger=mlflow here), and what they share: the step row's keys as W&B logs them
(`train/<key>`, or the key itself when it carries its own namespace: `moe/...`, `reward/...`), against the
trainer's own step, `train/step`.

TensorBoard and MLflow chart numbers only: a row's numbers (a bool as 0 or 1) go to them, its strings and
nulls (`skip_cause`, a weights hash, a null tokens/s) stay in history.jsonl and W&B. The step is the
tracker's own step axis (TensorBoard's global_step, MLflow's metric step), so `train/step` is not logged
as a value of its own.

- tensorboard: event files under `<run_dir>/tensorboard` (torch.utils.tensorboard, which needs the
  tensorboard package). A resume from this run dir's checkpoint at step S opens the writer with
  `purge_step=S+1`: what the earlier attempt logged past S is hidden, as history.jsonl moves its rows
  past S aside.
- mlflow: a local file store under `<run_dir>/mlruns` (MLFLOW_ALLOW_FILE_STORE=true, MLflow 3's opt-in for
  it, is set unless the environment sets it), experiment `logger.project`. The run id is kept in
  `<run_dir>/mlruns/align_run_id` before any metric is logged; a resume from this run dir's checkpoint
  continues that MLflow run, a fresh start gets a new one (as for W&B).

A missing package is refused in preflight (`missing_package`, exit 2) with the extra that installs it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from align.config import LoggerConfig, LoggerKind
from align.config.trainer_config import DEFAULT_PROJECT
from align.errors import ConfigError

STEP_KEY = "train/step"
PACKAGES = {LoggerKind.tensorboard: "tensorboard", LoggerKind.mlflow: "mlflow"}
"""The package each tracker needs; the extra of the same name installs it (pyproject.toml)."""
TENSORBOARD_DIR, MLFLOW_DIR = "tensorboard", "mlruns"
MLFLOW_RUN_ID = Path(MLFLOW_DIR) / "align_run_id"
_MLFLOW_BATCH = 1000  # MLflow's limit on the metrics of one log_batch call
"""Where a run dir keeps its MLflow run id, relative to the run dir."""


def missing_package(kind: LoggerKind) -> Optional[str]:
    """Why `logger=<kind>` cannot run here (its package is not installed), or None."""
    package = PACKAGES.get(kind)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"logger={kind.value} needs the {package} package, which is not installed: pip install align[{package}]"


def wandb_row(metrics: dict[str, Any], step: int) -> dict[str, Any]:
    """A step row as W&B logs it: the trainer's step under `train/step`, each key in its namespace."""
    return {STEP_KEY: step, **{k if "/" in k else f"train/{k}": v for k, v in metrics.items()}}


def scalar_row(metrics: dict[str, Any], step: int) -> dict[str, float]:
    """The W&B row's numbers, under the same keys, without `train/step` (the tracker's step axis)."""
    out = {}
    for k, v in wandb_row(metrics, step).items():
        if k != STEP_KEY and isinstance(v, (bool, int, float)):
            out[k] = float(v)
    return out


def summary_scalars(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`values` as flat chartable leaves: a nested mapping becomes `key/sub` keys, a list a JSON
    string (W&B would store a dict or a list as one opaque value)."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(summary_scalars(v, f"{key}/"))
        elif v is None or isinstance(v, (str, int, float, bool)):
            out[key] = v
        else:
            out[key] = json.dumps(v, default=str, sort_keys=True)
    return out


class Logger:
    """No-op logger (logger=none, or ranks other than 0)."""

    run_path: Optional[Path] = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def image(self, key: str, path: Path) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass

    def describe(self) -> Optional[dict[str, Any]]:
        """Which tracker ran and where it wrote (the manifest's `logger`); None: none ran on this rank."""
        return None


def _version(*dists: str) -> Optional[str]:
    """The installed version of the first of `dists` that is installed (MLflow's client ships as `mlflow` or
    as the lighter `mlflow-skinny`: one module, two distributions)."""
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _require(kind: LoggerKind) -> None:
    why = missing_package(kind)
    if why is not None:  # preflight refuses this first; a run built without it (in-process) is refused here
        raise ConfigError("logger", why)


def tensorboard_kwargs(run_dir: Path, start_step: int) -> dict[str, Any]:
    """Kwargs of torch.utils.tensorboard.SummaryWriter, built as data so preflight can check their names."""
    return {"log_dir": str(Path(run_dir) / TENSORBOARD_DIR), "purge_step": start_step + 1 if start_step else None}


class TensorBoardLogger(Logger):
    def __init__(self, run_dir: Path, start_step: int, config: dict[str, Any]) -> None:
        _require(LoggerKind.tensorboard)
        from torch.utils.tensorboard import SummaryWriter

        self.kwargs = tensorboard_kwargs(run_dir, start_step)
        self.writer = SummaryWriter(**self.kwargs)
        self.run_path = Path(self.kwargs["log_dir"])
        self.step = start_step
        self.writer.add_text("config", _json_block(config), global_step=start_step)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.step = step
        for k, v in scalar_row(metrics, step).items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()  # a row on disk per step, as history.jsonl: a killed run keeps what it logged

    def summary(self, values: dict[str, Any]) -> None:
        self.writer.add_text("summary", _json_block(summary_scalars(values)), global_step=self.step)
        self.writer.flush()

    def image(self, key: str, path: Path) -> None:
        import matplotlib.image

        self.writer.add_image(key, matplotlib.image.imread(str(path))[..., :3], global_step=self.step,
                              dataformats="HWC")

    def finish(self, exit_code: int = 0) -> None:
        self.writer.close()

    def describe(self) -> dict[str, Any]:
        return {"kind": "tensorboard", "dir": str(self.run_path), "purge_step": self.kwargs["purge_step"],
                "tensorboard": _version("tensorboard")}


def mlflow_run_kwargs(cfg: LoggerConfig, name: str) -> dict[str, Any]:
    """Kwargs of MlflowClient.create_run besides the experiment id."""
    return {"run_name": name, "tags": {"align.logger": "mlflow"}}


class MlflowLogger(Logger):
    _STATUS = {0: "FINISHED", 143: "KILLED"}

    def __init__(self, cfg: LoggerConfig, run_dir: Path, name: str, start_step: int, config: dict[str, Any]) -> None:
        _require(LoggerKind.mlflow)
        # MLflow 3 keeps its file store in maintenance and refuses it unless this opt-in is set; a run dir's
        # own store is a file store by design (no database to set up). A value the user set is kept.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        store = (Path(run_dir) / MLFLOW_DIR).resolve()
        store.mkdir(parents=True, exist_ok=True)
        self.uri = store.as_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        project = cfg.project or DEFAULT_PROJECT
        experiment = self.client.get_experiment_by_name(project)
        self.experiment_id = (experiment.experiment_id if experiment is not None
                              else self.client.create_experiment(project))
        id_file = Path(run_dir) / MLFLOW_RUN_ID
        stored = id_file.read_text().strip() if start_step and id_file.is_file() else ""
        if stored:  # a resume from this run dir's checkpoint continues its MLflow run
            self.run_id = stored
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(self.experiment_id, **mlflow_run_kwargs(cfg, name)).info.run_id
            id_file.write_text(self.run_id + "\n")
            self.client.log_dict(self.run_id, config, "config.json")
        self.run_path = store
        self.step = start_step

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        self.step = step
        now = int(time.time() * 1000)
        row = [Metric(_mlflow_key(k), v, now, step) for k, v in scalar_row(metrics, step).items()]
        for i in range(0, len(row), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=row[i:i + _MLFLOW_BATCH])

    def summary(self, values: dict[str, Any]) -> None:
        self.client.log_dict(self.run_id, summary_scalars(values), "summary.json")

    def image(self, key: str, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path=str(Path(key).parent))

    def finish(self, exit_code: int = 0) -> None:
        self.client.set_terminated(self.run_id, status=self._STATUS.get(exit_code, "FAILED"))

    def describe(self) -> dict[str, Any]:
        return {"kind": "mlflow", "tracking_uri": self.uri, "experiment_id": self.experiment_id,
                "run_id": self.run_id, "mlflow": _version("mlflow", "mlflow-skinny")}


def _mlflow_key(key: str) -> str:
    # MLflow's metric names take letters, digits and "_-. /"; align's keys are made of those already.
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


def _json_block(values: Any) -> str:
    return "```json\n" + json.dumps(values, indent=1, sort_keys=True, default=str) + "\n```"
