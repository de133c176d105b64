"""plots/loss.png of the objective's console metrics when the run ends, however it ends (rank 0: the
rank with a history), also logged to the tracker (align/telemetry/plots.py)."""

from __future__ import annotations

from align.callbacks.callback import Callback
from align.telemetry.console import watched
from align.telemetry.plots import plot_run


class LossPlot(Callback):
    def post_train(self, code: int) -> None:
        t = self.trainer
        if t.history is not None:
            plot_run(t.run_dir, t.cfg.name or t.run_dir.name, t.logger, watched(t.objective))
