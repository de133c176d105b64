"""The in-training eval's cadence (`eval=... trainer.eval_every=N`, align/evaluation/schedule.py): on a
step it is due, every rank runs it and its `eval/` keys go into that step's row."""

from __future__ import annotations

from typing import Any

from torch.profiler import record_function

from align.callbacks.callback import Callback


class EvalCadence(Callback):
    def pre_log_metrics(self, metrics: dict[str, Any], stopping: bool) -> None:
        """A stop skips it: the time left before the job is killed is for the stop checkpoint."""
        t = self.trainer
        if t.evals is not None and not stopping and t.evals.due(t.state.step):
            metrics.update(evaluate(t))


def evaluate(t: Any) -> dict[str, Any]:
    """The in-training eval on every rank (collective); its time is not the next step's."""
    t.stepper.sync()  # the step's parameters may still be written on a side stream
    with record_function("align.eval"):
        out = t.evals.run(t.model, t.autocast, compiled=t.model_info["compile"] is not None)
    t.t_boundary = None
    return out
