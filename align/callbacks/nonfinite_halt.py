"""Non-finite handling's verdicts (align/control/nonfinite.py): more than
`trainer.max_consecutive_skipped_steps` skipped steps in a row, or parameters that hold nan/inf where
they would be written (a checkpoint, the export, the end), halt every rank with the same message,
HALT.json and exit 81."""

from __future__ import annotations

import logging
from typing import Any, NoReturn, Optional

from align.callbacks.callback import Callback
from align.control.nonfinite import halt_message, nonfinite_parameters, parameters_message, write_halt
from align.errors import EXIT_NONFINITE, NonFiniteHalt

log = logging.getLogger("align")


class SkipLimit(Callback):
    def post_step(self, step: int, stopping: bool) -> None:
        if self.trainer.state.skips.over(self.trainer.cfg.trainer.max_consecutive_skipped_steps):
            halt(self.trainer)


def halt(t: Any, message: Optional[str] = None, **extra: Any) -> NoReturn:
    """Every rank gets here at the same step with the same statistics, hence the same message
    (by default: too many non-finite steps in a row); `extra` goes into HALT.json."""
    message = message or halt_message(t.state.skips, t.cfg.trainer.max_consecutive_skipped_steps)
    if t.env.is_main:
        write_halt(t.run_dir, message, t.state.step, t.state.skips, extra)
    log.error(message)
    t.finish(EXIT_NONFINITE)
    raise NonFiniteHalt(message)


def check_parameters(t: Any, refused: str) -> None:
    """Collective: halt (exit 81) on every rank when any rank's parameters hold nan/inf."""
    bad = nonfinite_parameters(t.model, t.env)
    if bad:
        total = sum(1 for _ in t.model.parameters())
        halt(t, parameters_message(bad, total, t.state.step, refused), nonfinite_parameters=bad)
