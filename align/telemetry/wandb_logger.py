"""W&B on rank 0: offline by default, one run per job (finished per job: a second `wandb.init`
without `finish` hands back the first run), metrics under train/ stepped by our own `train/step`
key, so a resume never drops rows (W&B drops a row whose step is below its current one).

A run dir is one W&B run: its id is stored in `<run_dir>/wandb/align_run_id` when the run starts,
and a resume from that run dir's checkpoint reuses it (`resume="allow"`), so the resumed attempt
continues the same W&B run, its `train/step` carrying on from the checkpoint. A fresh start in the
same dir (no checkpoint, or `trainer.resume=never`) gets a new id: its steps restart at 1.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import secrets
import string
from pathlib import Path
from typing import Any, Optional

from align.config import LoggerConfig, LoggerKind
from align.config.trainer_config import DEFAULT_PROJECT, WandbMode
from align.core.redaction import redact
from align.errors import ConfigError
from align.telemetry.trackers import Logger, MlflowLogger, TensorBoardLogger, summary_scalars, wandb_row

log = logging.getLogger("align")

RUN_ID_FILE = Path("wandb") / "align_run_id"
"""Where a run dir keeps its W&B run id, relative to the run dir."""


def new_run_id() -> str:
    # W&B's own alphabet and length (wandb.util.generate_id), without importing wandb for it.
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def wandb_run_id(run_dir: Path, resuming: bool) -> str:
    """The W&B run id of `run_dir`: the stored one when this run resumes, else a new one."""
    path = Path(run_dir) / RUN_ID_FILE
    if resuming and path.is_file():
        stored = path.read_text().strip()
        if stored:
            return stored
    return new_run_id()


def sweep_job_name(task_overrides: list[str], sweep_overrides: Optional[list[str]]) -> Optional[str]:
    """A multirun job's name: its values of the swept keys (`optimizer.lr=0.0001,data.max_seq_len=512`).
    `sweep_overrides` is the sweep's command line (multirun.yaml); without it, all the job's overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from align.core.redaction import redact_argv

    swept = None
    if sweep_overrides:
        parser, swept = OverridesParser.create(), set()
        for text in sweep_overrides:
            try:  # multirun.yaml is redacted (align/run/hydra_files.py): `key=<redacted>` parses no more
                swept |= {o.key_or_group for o in parser.parse_overrides([text]) if o.is_sweep_override()}
            except OverrideParseException:
                continue
    mine = [o for o in task_overrides if swept is None or o.split("=", 1)[0].lstrip("+~") in swept]
    return ",".join(redact_argv(mine)) or None


def hydra_job_name() -> Optional[str]:
    """`sweep_job_name` of the Hydra multirun job this process runs, or None outside a multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep_file = Path(hc.sweep.dir) / "multirun.yaml"
    sweep = None
    if sweep_file.is_file():  # written by Hydra in the sweep dir before the first job starts
        sweep = list(OmegaConf.load(sweep_file).hydra.overrides.task)
    return sweep_job_name(list(hc.overrides.task), sweep)


WANDB_ENV = {"project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "mode": "WANDB_MODE"}
"""The environment variables W&B users set, by the `logger` key that wins over each where set."""


def wandb_settings(cfg: LoggerConfig, environ: Optional[dict[str, str]] = None) -> dict[str, dict[str, Any]]:
    """project, entity and mode with where each came from: the config's key where set (not null), else
    its $WANDB_* variable where set, else align's default (the manifest's `logger.sources`). A
    $WANDB_MODE other than online or offline is refused: W&B's own "disabled" is logger=none here."""
    environ = os.environ if environ is None else environ
    defaults = {"project": DEFAULT_PROJECT, "entity": None, "mode": WandbMode.offline.value}
    out: dict[str, dict[str, Any]] = {}
    for key, var in WANDB_ENV.items():
        given = getattr(cfg, key)
        if given is not None:
            out[key] = {"value": getattr(given, "value", given), "source": f"logger.{key}"}
        elif environ.get(var):
            out[key] = {"value": environ[var], "source": f"${var}"}
        else:
            out[key] = {"value": defaults[key], "source": "default"}
    accepted = [m.value for m in WandbMode]
    if out["mode"]["value"] not in accepted:
        raise ConfigError("WANDB_MODE", f"accepted with logger=wandb: {', '.join(accepted)} (no tracker: "
                          "logger=none; logger.mode wins over the variable)", out["mode"]["value"])
    return out


def wandb_init_kwargs(cfg: LoggerConfig, run_dir: Path, name: str, group: Optional[str], config: dict,
                      resuming: bool = False) -> dict[str, Any]:
    """Kwargs for `wandb.init`, built as data so preflight can check their names; every value under the
    rule of every written value (a token-shaped `name`, project or tag is redacted: align.core.redaction).
    project, entity and mode: `wandb_settings` (the config, else $WANDB_*, else align's default)."""
    settings = wandb_settings(cfg) if cfg.kind == LoggerKind.wandb else {}
    value = {k: settings[k]["value"] if k in settings else getattr(cfg, k) for k in WANDB_ENV}
    return redact({
        "project": value["project"] or DEFAULT_PROJECT,
        "entity": value["entity"],
        "name": (hydra_job_name() or name) if group else name,
        "group": group,
        "tags": list(cfg.tags),
        "dir": str(run_dir),
        "mode": getattr(value["mode"], "value", value["mode"]) or WandbMode.offline.value,
        "config": config,
        "reinit": "finish_previous",
        "id": wandb_run_id(run_dir, resuming),
        "resume": "allow",
    })


def has_export(export_dir: Path) -> bool:
    """A completed export: the merged model's config.json, or the adapter alone (model.lora.export=adapter)."""
    return (export_dir / "config.json").is_file() or (export_dir / "adapter" / "adapter_config.json").is_file()


def artifact_kwargs(run_id: str, step: int, export_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Kwargs of `wandb.Artifact` and of `Run.log_artifact` for the exported model."""
    return ({"name": f"run-{run_id}-model", "type": "model",
             "metadata": {"step": step, "export_dir": str(export_dir)}},
            {"aliases": ["latest", f"step-{step}"]})


class WandbLogger(Logger):
    def __init__(self, init_kwargs: dict[str, Any], log_model: bool = False,
                 sources: Optional[dict[str, str]] = None) -> None:
        import wandb

        run_dir = Path(init_kwargs["dir"])
        (run_dir / RUN_ID_FILE).parent.mkdir(parents=True, exist_ok=True)
        # Stored before init: an attempt killed during init still leaves the id its resume will use.
        (run_dir / RUN_ID_FILE).write_text(init_kwargs["id"] + "\n")
        self.run = wandb.init(**init_kwargs)
        self.mode = init_kwargs["mode"]
        self.settings = {"project": init_kwargs["project"], "entity": init_kwargs["entity"], "sources": sources or {}}
        self.run.define_metric("train/step")
        # Every namespace a step row logs is charted against the trainer's step, which a resume carries
        # on (W&B's own counter does not): moe/* (router telemetry), rewards/*, logps/*, nll/* (preference).
        for pattern in ("train/*", "moe/*", "rewards/*", "logps/*", "nll/*"):
            self.run.define_metric(pattern, step_metric="train/step")
        self.run_path = Path(self.run.dir).parent if self.run.dir else None
        self.export_dir = run_dir / "export" if log_model else None
        self.step = 0
        self.loss: Optional[float] = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.step = step
        if isinstance(metrics.get("loss"), (int, float)):
            self.loss = float(metrics["loss"])
        # Keys that carry their own namespace (moe/l{i}/...) keep it.
        self.run.log(redact(wandb_row(metrics, step)))

    def summary(self, values: dict[str, Any]) -> None:
        flat = redact(summary_scalars(values))
        if self.loss is not None:  # the headline number; the loss function's settings are under loss/
            flat["loss"] = self.loss
        self.run.summary.update(flat)

    def image(self, key: str, path: Path) -> None:
        import wandb

        self.run.log({key: wandb.Image(str(path))})

    def finish(self, exit_code: int = 0) -> None:
        if exit_code == 0 and self.export_dir is not None:
            self.log_model()
        self.run.finish(exit_code=exit_code)

    def describe(self) -> dict[str, Any]:
        return {"kind": "wandb", "dir": None if self.run_path is None else str(self.run_path), "id": self.run.id,
                "mode": self.mode, **self.settings, "wandb": importlib.metadata.version("wandb")}

    def log_model(self) -> None:
        import wandb

        if not has_export(self.export_dir):
            log.warning("logger.log_model: no export in %s, no model artifact logged", self.export_dir)
            return
        art_kw, log_kw = artifact_kwargs(self.run.id, self.step, self.export_dir)
        artifact = wandb.Artifact(**art_kw)
        artifact.add_dir(str(self.export_dir))
        self.run.log_artifact(artifact, **log_kw)


def build_logger(cfg: LoggerConfig, is_main: bool, init_kwargs: dict[str, Any], start_step: int = 0) -> Logger:
    """Rank 0's tracker (a no-op elsewhere). `init_kwargs` are W&B's (the run dir, name and config every
    tracker takes from them); `start_step` is the step this attempt starts from (a resume's checkpoint)."""
    if cfg.kind == LoggerKind.none or not is_main:
        return Logger()
    if cfg.kind == LoggerKind.tensorboard:
        return TensorBoardLogger(Path(init_kwargs["dir"]), start_step, init_kwargs["config"])
    if cfg.kind == LoggerKind.mlflow:
        return MlflowLogger(cfg, Path(init_kwargs["dir"]), init_kwargs["name"], start_step, init_kwargs["config"])
    sources = {k: v["source"] for k, v in wandb_settings(cfg).items()}
    return WandbLogger(init_kwargs, log_model=cfg.log_model, sources=sources)
