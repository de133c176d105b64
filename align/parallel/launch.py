"""What each rank of a launch writes where (docs/pitfalls.md#10). Only rank 0 writes Hydra's `.hydra/`, the
history and W&B; rank r > 0 keeps its own log under <run_dir>/rank<r>/. The run dir itself is
computed ONCE by the launcher (launchers/torchrun.sh) and passed to every rank as hydra.run.dir.

An attempt in a run dir that already held a run (a resume, a restart) writes nothing of its own there
until it is accepted (`Attempt`): rank 0's `.hydra/`, manifest and log go to `.hydra.pending/`
(align.run.record), a rank r > 0 keeps its log in memory, and the exit record of an attempt that ends
before acceptance goes to `$ALIGN_EXIT_DIR` only (align.control.exit_record).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from align.core.redaction import RedactingFilter

if TYPE_CHECKING:  # align.train imports this module first thing; a refusal must not pay for torch
    from align.parallel.env import DistEnv


@dataclass
class Attempt:
    """This process's claim on its run dir."""

    held: bool = False
    """The run dir held a run before this attempt started (decided before Hydra ran)."""
    accepted: bool = False
    """Resume decided and loaded, trainer built (align.run.record.RunRecord.accept): the dir is this attempt's."""

    def owns_run_dir(self) -> bool:
        return self.accepted or not self.held


ATTEMPT = Attempt()


def rank_overrides() -> list[str]:
    """Extra Hydra overrides for this process: ranks > 0 write no `.hydra/` and log to stdout only
    (their file log is attached by `log_rank_to_file`)."""
    if int(os.environ.get("RANK", "0")) == 0:
        return []
    return ["hydra.output_subdir=null", "hydra/job_logging=stdout"]


def log_rank_to_file(env: DistEnv, run_dir: Path) -> None:
    if env.is_main:
        return
    path = Path(run_dir) / f"rank{env.rank}" / "train.log"
    root = logging.getLogger()
    if any(isinstance(h, (logging.FileHandler, _PendingLog)) and Path(_target(h)) == path.resolve()
           for h in root.handlers):
        return
    fmt = logging.Formatter("[%(asctime)s][rank" + str(env.rank) + "][%(name)s][%(levelname)s] - %(message)s")
    if not ATTEMPT.owns_run_dir():  # held until accepted (adopt_rank_log); it is on stdout meanwhile
        pending = _PendingLog(path.resolve())
        pending.setFormatter(fmt)
        root.addHandler(pending)
        return
    env.rank_dir(run_dir)
    handler = logging.FileHandler(path)
    handler.setFormatter(fmt)
    handler.addFilter(RedactingFilter())  # the rule of every written value (align.core.redaction)
    root.addHandler(handler)


def _target(handler: logging.Handler) -> str:
    return str(getattr(handler, "path", None) or getattr(handler, "baseFilename", ""))


class _PendingLog(logging.handlers.MemoryHandler):
    """A rank's log records kept in memory until the attempt owns its run dir."""

    def __init__(self, path: Path) -> None:
        super().__init__(capacity=1 << 30, flushLevel=logging.CRITICAL + 1)
        self.path = path

    def shouldFlush(self, record: logging.LogRecord) -> bool:
        return False


def adopt_rank_log() -> None:
    """The attempt was accepted: a rank's held log records go to its file, and so does the rest."""
    root = logging.getLogger()
    for pending in [h for h in root.handlers if isinstance(h, _PendingLog)]:
        pending.path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(pending.path)
        handler.setFormatter(pending.formatter)
        handler.addFilter(RedactingFilter())
        for record in pending.buffer:
            handler.handle(record)
        root.removeHandler(pending)
        pending.buffer.clear()
        pending.close()
        root.addHandler(handler)


def adopt_staged_log(staging: Path, run_dir: Path) -> None:
    """Rank 0's log went to `staging` until the attempt was accepted: append it to the run dir's log of
    the same name and have the handler write there from now on (under its lock: no record lands between)."""
    for h in logging.getLogger().handlers:
        if not (isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent == Path(staging).resolve()):
            continue
        staged = Path(h.baseFilename)
        final = Path(run_dir).resolve() / staged.name
        with h.lock:
            h.flush()
            with open(final, "ab") as out:
                out.write(staged.read_bytes() if staged.is_file() else b"")
            old = h.setStream(open(final, "a", encoding=h.encoding))
            h.baseFilename = str(final)
            if old is not None:
                old.close()
            staged.unlink(missing_ok=True)


def record_exit(code: int) -> None:
    """This rank's exit code under <run_dir>/rank<r>/exit.json (see align.control.exit_record), unless
    the attempt ended before it was accepted into a run dir that held a run: that dir is left as it was,
    and the code goes to `$ALIGN_EXIT_DIR` only."""
    from hydra.core.hydra_config import HydraConfig

    from align.control.exit_record import write_exit

    try:
        run_dir: Optional[Path] = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under Hydra
        run_dir = None
    write_exit(run_dir if ATTEMPT.owns_run_dir() else None, int(os.environ.get("RANK", "0")), code)
