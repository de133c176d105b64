"""The tracker finishes last, with the run's exit code: the summary, the last rows and the loss plot
are in it by then."""

from __future__ import annotations

from align.callbacks.callback import Callback


class TrackerFinish(Callback):
    def post_train(self, code: int) -> None:
        self.trainer.logger.finish(code)
