"""`trainer.compile_artifacts`: torch.compiler's portable cache artifacts in one file, loaded before
anything compiles and written when the run ends.

The persistent inductor cache (`align.parallel.compile.apply_cache_dir`) serves the next run on the
same disk. A machine that starts empty each job (a fresh cloud or CI GPU host) has no such disk, so
it pays every compile again; one file carried in and out skips them. torch decides what the file
holds (compiled FX graphs, AOTAutograd entries, Triton kernels, autotune results); the loaded entries
go into the same caches the compiles look up, under the keys torch computes for them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from align.errors import ConfigError

KEY = "trainer.compile_artifacts"


def _counts(info: Any) -> dict[str, int]:
    """A CacheInfo as {artifact kind: how many}."""
    kinds = getattr(info, "artifacts", None) or {}
    return {str(kind): len(entries) for kind, entries in kinds.items() if entries}


NOT_A_FILE = "must name a file (written at the end of the run, loaded at the start)"
UNREADABLE = "is not torch.compiler cache artifacts this torch can read; delete the file or name another"


def problem(path: str) -> Optional[str]:
    """Why `path` cannot serve as the artifacts file, or None (a missing file is fine: the run writes
    it). Preflight asks before the run dir exists; it unpacks the file without loading it into the
    caches (torch's own unpacking, which is what the load runs first)."""
    p = Path(path)
    if not p.exists():
        return None
    if not p.is_file():
        return NOT_A_FILE
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:  # a torch release that moved it: the load in Trainer.build still refuses the file
        return None
    return UNREADABLE if CacheArtifactManager.deserialize(p.read_bytes()) is None else None


def load(path: Optional[str]) -> Optional[dict[str, Any]]:
    """Hot-load the artifacts at `path` into torch's caches, before the first compile. The record:
    the path, and what was loaded (None: no file yet; the run's end writes it). A path that is not a
    file, or a file torch cannot read as artifacts, is refused (exit 2) before the model is built."""
    if path is None:
        return None
    p = Path(path)
    record: dict[str, Any] = {"path": str(p.resolve()), "loaded": None, "saved": None}
    if not p.exists():
        record["loaded_why"] = "no file yet: the end of this run writes it"
        return record
    if not p.is_file():
        raise ConfigError(KEY, NOT_A_FILE, path)
    import torch.compiler

    data = p.read_bytes()
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as e:  # whatever a torch release raises for bytes it did not write
        info, why = None, f" ({type(e).__name__}: {str(e)[:120]})"
    else:
        why = ""  # torch logs why and returns None
    if info is None:
        raise ConfigError(KEY, UNREADABLE.replace(";", f"{why};", 1), path)
    record["loaded"] = {"bytes": len(data), "artifacts": _counts(info)}
    return record


def save(record: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """Write this process's artifacts to the record's path (atomically: a run killed mid-write leaves
    the earlier file). Nothing new to write (no compile ran, or every graph came from the loaded file
    and torch recorded none) keeps the file as it is. Returns the record with `saved` filled in."""
    if record is None:
        return None
    import torch.compiler

    out = torch.compiler.save_cache_artifacts()
    if out is None:
        return {**record, "saved": None, "saved_why": "torch recorded no artifacts in this process: file kept"}
    data, info = out
    path = Path(record["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return {**record, "saved": {"bytes": len(data), "artifacts": _counts(info)}}


def save_at_end(choice: dict[str, Any], is_main: bool) -> None:
    """The run's end: rank 0 saves into the compile record `choice` (every rank compiled the same graphs)."""
    if is_main and choice.get("artifacts") is not None:
        choice["artifacts"] = save(choice["artifacts"])
