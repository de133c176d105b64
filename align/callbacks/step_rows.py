"""Each step's row: history.jsonl on rank 0 (rows hold values reduced over ranks), then the tracker
(W&B, TensorBoard, MLflow or none: align/telemetry/wandb_logger.py, align/telemetry/trackers.py).
Opened once the start is accepted (the resume decided and its checkpoint loaded): the history keeps
one row per step (rows past the step this attempt starts from, even 0, move aside), the tracker
starts at that step. At the end: the run's summary into the tracker, then the history is closed."""

from __future__ import annotations

import logging
from typing import Any, Optional

from align.callbacks.callback import Callback
from align.control.resume import trim_history
from align.telemetry.history import History
from align.telemetry.wandb_logger import build_logger, wandb_init_kwargs

log = logging.getLogger("align")


class StepRows(Callback):
    def __init__(self, trainer: Any, wandb_config: Optional[dict], group: Optional[str], resuming: bool) -> None:
        super().__init__(trainer)
        t = trainer
        if t.env.is_main:
            moved = trim_history(t.run_dir / "history.jsonl", t.state.step)
            if moved:
                log.info("history: %d row(s) past step %d moved to history.superseded.jsonl", moved, t.state.step)
            t.history = History(t.run_dir / "history.jsonl")
        kwargs = wandb_init_kwargs(t.cfg.logger, t.run_dir, t.cfg.name or t.run_dir.name, group, wandb_config or {},
                                   resuming=resuming)
        t.logger = build_logger(t.cfg.logger, t.env.is_main, kwargs, t.state.step)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        write_row(self.trainer, metrics)

    def post_train(self, code: int) -> None:
        t = self.trainer
        t.logger.summary(t.summary())
        if t.history is not None:
            t.history.close()


def write_row(t: Any, metrics: dict[str, Any]) -> None:
    """The history row first: it is the run's own record (a resume trims it, the plot and the console
    summary read it); a tracker that fails leaves it written."""
    if t.history is not None:
        t.history.append(metrics)
    t.logger.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])
