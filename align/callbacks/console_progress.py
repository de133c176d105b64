"""What a person reads of the run (rank 0, align/telemetry/console.py, align/telemetry/progress.py):
the start block and a bar or log lines of the objective's metrics while it trains, the summary when
it ends."""

from __future__ import annotations

import time
from typing import Any, Optional

from align.callbacks.callback import Callback
from align.telemetry.console import announce_end
from align.telemetry.progress import Progress, start_progress


class ConsoleProgress(Callback):
    progress: Optional[Progress] = None
    """From `fit()`'s start; None before (a probe writes rows of steps it runs without `fit()`)."""

    def pre_train(self) -> None:
        self.progress = start_progress(self.trainer)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.update(metrics)

    def post_train(self, code: int) -> None:
        """Once the history is closed and the plot drawn: the summary reads history.jsonl."""
        t = self.trainer
        if t.history is not None:
            announce_end(t, code, time.perf_counter() - t.t_start)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
