"""W&B on rank 0: offline by default, one run per job (finished per job, LANDMINES 14), metrics
under train/ stepped by our own `train/step` key so a resume never drops rows (LANDMINES 15)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from align.config import LoggerConfig, LoggerKind


def wandb_init_kwargs(cfg: LoggerConfig, run_dir: Path, name: str, group: Optional[str], config: dict) -> dict[str, Any]:
    """Kwargs for `wandb.init`, built as data so preflight can check their names."""
    return {
        "project": cfg.project,
        "entity": cfg.entity,
        "name": name,
        "group": group,
        "tags": list(cfg.tags),
        "dir": str(run_dir),
        "mode": cfg.mode.value,
        "config": config,
        "reinit": "finish_previous",
    }


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


class WandbLogger(Logger):
    def __init__(self, init_kwargs: dict[str, Any]) -> None:
        import wandb

        Path(init_kwargs["dir"]).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(**init_kwargs)
        self.run.define_metric("train/step")
        self.run.define_metric("train/*", step_metric="train/step")
        self.run.define_metric("moe/*", step_metric="train/step")
        self.run_path = Path(self.run.dir).parent if self.run.dir else None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        # Keys that carry their own namespace (moe/l{i}/...) keep it.
        self.run.log({"train/step": step, **{k if "/" in k else f"train/{k}": v for k, v in metrics.items()}})

    def summary(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            self.run.summary[k] = v

    def image(self, key: str, path: Path) -> None:
        import wandb

        self.run.log({key: wandb.Image(str(path))})

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


def build_logger(cfg: LoggerConfig, is_main: bool, init_kwargs: dict[str, Any]) -> Logger:
    if cfg.kind == LoggerKind.none or not is_main:
        return Logger()
    return WandbLogger(init_kwargs)
