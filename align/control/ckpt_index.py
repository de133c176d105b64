"""Which checkpoints exist, which count, which to delete. No torch import: the supervisor uses it.

Layout: <run_dir>/checkpoints/step_<8 digits>/ holding model/ and optim/ (torch.distributed.checkpoint
directories, each with its `.metadata`), rank<r>.json per rank and meta.json. Everything is written
into `step_N.tmp/` and renamed at the end, so a directory with the final name is complete; the file
checks below also reject a complete-looking copy that lost a part. A pruned checkpoint is first renamed
to `step_N.prune/` and then deleted, so an interrupted prune never leaves a half-deleted directory under
a checkpoint's name; whatever an interrupted prune or a broken copy left is deleted by the next prune.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

CHECKPOINTS = "checkpoints"
PRUNING = ".prune"
"""Suffix of a checkpoint being deleted (renamed first: the rename is atomic, a deletion is not)."""
_NAME = re.compile(r"step_(\d{8})")


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def problem(d: Path) -> Optional[str]:
    """Why `d` is not a complete checkpoint, or None when it is."""
    d = Path(d)
    if not _NAME.fullmatch(d.name):
        return f"{d.name} is not a checkpoint name (step_NNNNNNNN; .tmp means unfinished)"
    for part in ("model/.metadata", "optim/.metadata", "meta.json"):
        if not (d / part).is_file():
            return f"{d} has no {part}"
    try:
        meta = json.loads((d / "meta.json").read_text())
        world = int(meta["world_size"])
    except (ValueError, KeyError, TypeError) as e:
        return f"{d}/meta.json is unreadable ({e})"
    missing = [r for r in range(world) if not (d / f"rank{r}.json").is_file()]
    if missing:
        return f"{d} lacks rank files for ranks {missing}"
    return None


def complete(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_dir()]
    return sorted((s, p) for s, p in found if problem(p) is None)


def broken(root: Path) -> list[tuple[int, Path, str]]:
    """Directories with a checkpoint's name that are not complete (a part lost, a deletion cut short):
    (step, path, why), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_dir())
    return [(s, p, why) for s, p in found if (why := problem(p)) is not None]


def newest(root: Path) -> Optional[tuple[int, Path]]:
    ckpts = complete(root)
    return ckpts[-1] if ckpts else None


def to_prune(root: Path, keep_last: int, upto_step: int) -> list[Path]:
    """Complete checkpoints at or below `upto_step` beyond the newest `keep_last` (0 keeps all), and
    the leftovers of earlier prunes: `step_N.prune/` dirs and broken dirs at or below `upto_step`
    (nothing can resume from them).

    Older checkpoints a previous attempt of the run left are adopted (counted and pruned) so a run
    that resumes N times does not leak N checkpoints; ones NEWER than `upto_step` (left by an attempt
    that got further than the checkpoint this run resumed from) are not touched."""
    if keep_last <= 0:
        return []
    ours = [p for s, p in complete(root) if s <= upto_step]
    leftovers = [p for s, p, _ in broken(root) if s <= upto_step]
    return sorted(leftovers + ours[:-keep_last] + being_pruned(root))


def being_pruned(root: Path) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.glob(f"step_*{PRUNING}") if p.is_dir()) if root.is_dir() else []


def stale_tmp(root: Path) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.glob("step_*.tmp") if p.is_dir()) if root.is_dir() else []
