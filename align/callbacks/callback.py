"""The trainer's hooks: a `Callback` does one side job of the run at the points of `Trainer.fit` it
overrides (every hook does nothing by default); `Callbacks` calls each hook on every callback in the
list's order (align/callbacks/__init__.py: the run's list, and why in that order).

A callback holds the trainer it serves and reads what it needs from it (state, env, config, the
history and the tracker); it never imports align.trainer (align.trainer imports the callbacks)."""

from __future__ import annotations

from typing import Any, Sequence


class Callback:
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def pre_train(self) -> None:
        """`fit()` starts, before the first step (and before the loop handles stop signals)."""

    def pre_log_metrics(self, metrics: dict[str, Any], stopping: bool) -> None:
        """The step's row before anyone writes it: a callback may add to `metrics`. `stopping`: the
        boundary agreed to stop after this step."""

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """Write the step's row (under the `align.log` profiler phase: align/probes/gaps.py)."""

    def post_step(self, step: int, stopping: bool) -> None:
        """After the row is written; may end the run (a halt raises)."""

    def post_train(self, code: int) -> None:
        """The run ends with exit `code` (0 done, 143 stopped, 81 halted): the records of the whole run."""

    def close(self) -> None:
        """`fit()`'s loop is left, however (after `post_train` on a stop or a halt, before it at the end)."""


class Callbacks:
    """The run's callbacks, each hook called on all of them in order."""

    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        self.callbacks = list(callbacks)

    def __iter__(self):
        return iter(self.callbacks)

    def pre_train(self) -> None:
        for c in self.callbacks:
            c.pre_train()

    def pre_log_metrics(self, metrics: dict[str, Any], stopping: bool) -> None:
        for c in self.callbacks:
            c.pre_log_metrics(metrics, stopping)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.log_metrics(metrics)

    def post_step(self, step: int, stopping: bool) -> None:
        for c in self.callbacks:
            c.post_step(step, stopping)

    def post_train(self, code: int) -> None:
        for c in self.callbacks:
            c.post_train(code)

    def close(self) -> None:
        for c in self.callbacks:
            c.close()
