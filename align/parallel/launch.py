"""What each rank of a launch writes where (docs/pitfalls.md#10). Only rank 0 writes Hydra's `.hydra/`, the
history and W&B; rank r > 0 keeps its own log under <run_dir>/rank<r>/. The run dir itself is
computed ONCE by the launcher (launchers/torchrun.sh) and passed to every rank as hydra.run.dir."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # align.train imports this module first thing; a refusal must not pay for torch
    from align.parallel.env import DistEnv


def rank_overrides() -> list[str]:
    """Extra Hydra overrides for this process: ranks > 0 write no `.hydra/` and log to stdout only
    (their file log is attached by `log_rank_to_file`)."""
    if int(os.environ.get("RANK", "0")) == 0:
        return []
    return ["hydra.output_subdir=null", "hydra/job_logging=stdout"]


def log_rank_to_file(env: DistEnv, run_dir: Path) -> None:
    if env.is_main:
        return
    path = env.rank_dir(run_dir) / "train.log"
    root = logging.getLogger()
    if any(isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path.resolve() for h in root.handlers):
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s][rank" + str(env.rank) + "][%(name)s][%(levelname)s] - %(message)s"))
    root.addHandler(handler)


def record_exit(code: int) -> None:
    """This rank's exit code under <run_dir>/rank<r>/exit.json (see align.control.exit_record)."""
    from hydra.core.hydra_config import HydraConfig

    from align.control.exit_record import write_exit

    try:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under Hydra
        return
    write_exit(run_dir, int(os.environ.get("RANK", "0")), code)
