"""Each rank records its exit code in <run_dir>/rank<r>/exit.json. torchrun reports any worker
failure as exit 1, which would hide a non-finite halt (81) or a refused configuration (2) from the
supervisor and from launchers/torchrun.sh; they read these files instead. No torch import.

A launcher that sets `$ALIGN_EXIT_DIR` (launchers/torchrun.sh, a dir of its own per launch) gets every
rank's record there as well, including those no run dir may hold: a command refused before Hydra ran
(nothing is written into a run dir then), and an attempt refused before it was accepted into a run dir
that already held a run (align.parallel.launch.Attempt: that dir is left as it was).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

EXIT_DIR_ENV = "ALIGN_EXIT_DIR"


def _write(d: Path, rank: int, code: int) -> None:
    d = d / f"rank{rank}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "exit.json").write_text(json.dumps({"rank": rank, "code": int(code), "time": time.time()}))


def write_exit(run_dir: Optional[Path], rank: int, code: int) -> None:
    """This rank's record under `run_dir` (None: not there) and under `$ALIGN_EXIT_DIR` when set."""
    if run_dir is not None:
        _write(Path(run_dir), rank, code)
    if os.environ.get(EXIT_DIR_ENV):
        _write(Path(os.environ[EXIT_DIR_ENV]), rank, code)


def recorded_exit(run_dir: Path, since: float = 0.0) -> Optional[int]:
    """The code the ranks recorded after `since`: 81 if any rank halted, else the code they all
    agree on; None when no rank recorded one (a crash) or they disagree."""
    codes = []
    for f in Path(run_dir).glob("rank*/exit.json"):
        try:
            row = json.loads(f.read_text())
        except ValueError:
            continue
        if row.get("time", 0) >= since:
            codes.append(int(row["code"]))
    if not codes:
        return None
    if 81 in codes:
        return 81
    return codes[0] if len(set(codes)) == 1 else None


if __name__ == "__main__":  # launchers/torchrun.sh: python -m align.control.exit_record RUN_DIR SINCE
    import sys

    code = recorded_exit(Path(sys.argv[1]), float(sys.argv[2]))
    print("" if code is None else code)
