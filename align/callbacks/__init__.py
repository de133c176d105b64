"""The trainer's side jobs, one callback each (align/callbacks/callback.py: the hooks): `Trainer.fit`
trains; what is written, shown, evaluated and refused around its steps is here.

The run's list (`for_run`) is the order every hook runs in, and today's order is kept on purpose:

1. CompileArtifacts (compile_cache.py; post_train): the portable compile cache is saved first when
   the run ends: it needs nothing the others write, and nothing failing after it costs the next run it.
2. EvalCadence (eval_cadence.py; pre_log_metrics): its `eval/` keys belong to the step's row, so it
   runs before any row is written, hence before the checkpoint, which follows the row (7). A stop
   skips it: the time left is the stop checkpoint's.
3. StepRows (step_rows.py; log_metrics, post_train): the history row, then the tracker's: the history
   is the run's own record (a resume trims it, the plot and the summary read it), so a tracker that
   fails leaves it written. At the end the run's summary goes to the tracker, then the history is
   closed, before anything reads it back.
4. LossPlot (loss_plot.py; post_train): drawn from the closed history, logged to the tracker, still open.
5. ConsoleProgress (console_progress.py; pre_train, log_metrics, post_train, close): its progress line
   is the row just written; its end summary reads the closed history, after the plot.
6. SkipLimit (nonfinite_halt.py; post_step): after the rows, so the step that halts the run has its
   row (`skipped: true`); before the checkpoint, so a halted run writes none (a halt is a verdict,
   not a stop: there is nothing to resume).
7. Checkpoints (checkpointing.py; post_step): last of a step: the checkpoint of step N follows row
   N, so a resume from it (history trimmed to its step) continues a complete history; after a
   stop's checkpoint `fit()` returns 143.
8. TrackerFinish (tracker_finish.py; post_train): last of all, once the summary and the plot are in it.

`for_run` is called once the start is accepted (`Trainer.build`, after the resume hand-off, which
leaves only complete checkpoints): StepRows trims and opens the history and starts the tracker there."""

from __future__ import annotations

from typing import Any, Optional

from align.callbacks.callback import Callback, Callbacks
from align.callbacks.checkpointing import Checkpoints, hand_off, resume_decision
from align.callbacks.compile_cache import CompileArtifacts
from align.callbacks.console_progress import ConsoleProgress
from align.callbacks.eval_cadence import EvalCadence
from align.callbacks.loss_plot import LossPlot
from align.callbacks.nonfinite_halt import SkipLimit, check_parameters
from align.callbacks.step_rows import StepRows
from align.callbacks.tracker_finish import TrackerFinish

__all__ = ["Callback", "Callbacks", "check_parameters", "for_run", "hand_off", "resume_decision"]


def for_run(trainer: Any, wandb_config: Optional[dict], group: Optional[str], resuming: bool) -> Callbacks:
    """The run's callbacks, in the order above."""
    return Callbacks([CompileArtifacts(trainer), EvalCadence(trainer), StepRows(trainer, wandb_config, group, resuming),
                      LossPlot(trainer), ConsoleProgress(trainer), SkipLimit(trainer), Checkpoints(trainer),
                      TrackerFinish(trainer)])
