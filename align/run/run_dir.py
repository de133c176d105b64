"""The run dir a command will write, known before Hydra creates it, and whether the command may write there.

Hydra creates the run dir and writes `.hydra/` and its log there before any align code of the job
runs, so every check on the dir happens in the pass before Hydra (`check_run_dirs`), one line and
exit 2 on a refusal, nothing written:

- a dir that cannot be created or written (a parent that is a file, a read-only filesystem, no
  permission) is refused, instead of Hydra's traceback;
- a dir whose path holds a credential-shaped name (align.core.redaction) is refused: the path is
  written to the manifest, the logs and W&B, where no redaction could hide it and keep the record true;
- a dir that holds a FINISHED run (`finished_run`) is never written again, by any command: the
  training command that made it, another one, an eval or a probe. A run dir with checkpoints that did
  not finish (a stop, a kill, a crash) is where `align.train` resumes (docs/distributed.md); eval and
  probe never resume, so they refuse any dir that holds a run (`held_run`).

Where each job's dir goes is read from the composed `hydra` node as Hydra would resolve it
(`hydra.run.dir`, or `hydra.sweep.dir`/`hydra.sweep.subdir` for job i of a `-m` sweep); a dir that
cannot be resolved before Hydra runs falls back to the command line's `hydra.run.dir=`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from align.control.ckpt_index import checkpoint_root, newest
from align.run.manifest import MANIFEST

EXPORT = "export"
EVAL_RECORD = "eval.json"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _complete_ok(record: Any) -> bool:
    return isinstance(record, dict) and record.get("status") == "complete" and \
        isinstance(record.get("run"), dict) and record["run"].get("exit_code") == 0


def finished_run(run_dir: Path) -> Optional[str]:
    """What shows that `run_dir` holds a finished run, or None: a complete manifest with exit 0, an
    export (written only by a run that completed), rank 0's exit record saying 0, or a complete eval.json
    with exit 0. Any one is enough: a torchrun job may finish with its manifest on another rank's disk."""
    d = Path(run_dir)
    seen = []
    if _complete_ok(_json(d / MANIFEST)):
        seen.append(f"{MANIFEST}: complete, exit 0")
    if (d / EXPORT).is_dir():
        seen.append(f"{EXPORT}/")
    exit_row = _json(d / "rank0" / "exit.json")
    if isinstance(exit_row, dict) and exit_row.get("code") == 0:
        seen.append("rank0/exit.json: exit 0")
    if _complete_ok(_json(d / EVAL_RECORD)):
        seen.append(f"{EVAL_RECORD}: complete, exit 0")
    return "; ".join(seen) or None


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds the records an attempt of align.train would replace (align.run.record stages)."""
    return (Path(run_dir) / MANIFEST).is_file() or (Path(run_dir) / ".hydra").is_dir()


def run_dir_held(run_dir: Optional[Path], rank: int) -> bool:
    """Whether `run_dir` holds an earlier run, before this process's Hydra writes anything: rank 0 by
    the records it would replace, a rank r > 0 by those and its own rank<r>/ (another rank's Hydra may
    be writing a fresh dir's `.hydra/` right now: a fresh dir can read as held, never the reverse)."""
    if run_dir is None:
        return False
    return holds_run(run_dir) or (rank > 0 and (Path(run_dir) / f"rank{rank}").exists())


def held_run(run_dir: Path) -> Optional[str]:
    """What shows that `run_dir` holds a run (finished or not), or None."""
    d = Path(run_dir)
    names = (MANIFEST, EVAL_RECORD, ".hydra", "history.jsonl", "checkpoints", EXPORT)
    seen = [n for n in names if (d / n).exists()]
    return ", ".join(seen) or None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def unwritable(run_dir: Path) -> Optional[str]:
    """Why `run_dir` cannot be created or written into, or None."""
    p = Path(run_dir).absolute()
    try:
        if p.exists():
            if not p.is_dir():
                return f"{p} is a file, not a directory"
            at, verb = p, "write into"
        else:
            at, verb = next(a for a in p.parents if a.exists()), "create"
            if not at.is_dir():
                return f"cannot create {p}: {at} is a file, not a directory"
    except OSError as e:  # a parent we may not even look into
        return f"cannot create {p}: {e.strerror or e}"
    if _read_only(at):
        return f"cannot {verb} {p}: {at} is on a read-only filesystem"
    if not os.access(at, os.W_OK | os.X_OK):
        return f"cannot {verb} {p}: {at} is not writable by this user"
    return None


def planned_run_dirs(jobs: Sequence[Sequence[str]], multirun: bool, config_dir: Path, config_name: str,
                     job_name: str, fallback: Optional[Path] = None) -> list[tuple[str, Optional[Path]]]:
    """(the key that places it, the dir) of every job, as Hydra will resolve it: `jobs` and `multirun` as
    align.run.cli.job_override_lists gives them, `job_name` Hydra's (the entry module's name).
    `${now:...}` resolves to this moment: a new dir, as it will be for Hydra a moment later. A dir only
    Hydra's own run can resolve: `fallback` (the command line's hydra.run.dir=) for a single run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf, open_dict, read_write

    import align.config  # noqa: F401  (registers the training schemas; align.eval registers its own on import)

    setup_globals()  # Hydra's `now` resolver
    out: list[tuple[str, Optional[Path]]] = []
    saved = HydraConfig.instance().cfg  # `${hydra:...}` reads the singleton: set it per job, then put it back
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).absolute()), version_base="1.3",
                                   job_name=job_name):
            first = None
            for i, job in enumerate(jobs):
                if not multirun:
                    cfg = hydra_compose(config_name, overrides=list(job), return_hydra_config=True)
                    HydraConfig.instance().set_config(cfg)
                    out.append(("hydra.run.dir", Path(str(OmegaConf.select(cfg, "hydra.run.dir")))))
                    continue
                # one sweep dir for the sweep; the default subdir (the job's number) needs no composition per job
                if first is None or OmegaConf.to_container(first.hydra.sweep)["subdir"] != "${hydra.job.num}":
                    first = hydra_compose(config_name, overrides=list(job), return_hydra_config=True)
                    HydraConfig.instance().set_config(first)
                    sweep = Path(str(OmegaConf.select(first, "hydra.sweep.dir")))
                with read_write(first.hydra), open_dict(first.hydra):
                    first.hydra.job.num = first.hydra.job.id = i
                out.append(("hydra.sweep.dir", sweep / str(OmegaConf.select(first, "hydra.sweep.subdir"))))
    except Exception:  # an interpolation only Hydra's own run can resolve
        return [("hydra.run.dir", fallback)] if fallback is not None and not multirun else []
    finally:
        HydraConfig.instance().cfg = saved
    return out


def check_run_dirs(planned: Sequence[tuple[str, Optional[Path]]], resumes: bool = True) -> None:
    """Refuse (ConfigError, exit 2) before Hydra runs: a run dir that cannot be written, one whose path
    holds a credential, one that holds a finished run, and, for a command that never resumes
    (`resumes=False`), one that holds any run."""
    from align.core.redaction import CREDENTIAL_SHAPES, REDACTED, secret_shape
    from align.errors import ConfigError

    for key, d in planned:
        if d is None:
            continue
        if secret_shape(str(d.absolute()), "run_dir"):  # the manifest's rule for run.run_dir
            raise ConfigError(key, f"{CREDENTIAL_SHAPES.sub(REDACTED, str(d))} holds a credential-shaped name; a "
                              "run dir's path is written to the manifest, the logs and W&B, where it cannot be "
                              "redacted: choose a dir without it")
        why = unwritable(d)
        if why:
            raise ConfigError(key, f"{why}; choose a dir this process can create")
        done = finished_run(d)
        if done:
            raise ConfigError(key, f"{d} holds a finished run ({done}) and a finished run dir is never written "
                              f"again: choose a new dir (leave {key} unset for a fresh timestamped one)"
                              + (_carry_on(d) if resumes else ""))
        held = None if resumes else held_run(d)
        if held:
            raise ConfigError(key, f"{d} holds a run ({held}) that this command would replace (only align.train "
                              f"resumes a run dir): choose a new dir (leave {key} unset for a fresh timestamped one)")


def _carry_on(run_dir: Path) -> str:
    """How to train on from a finished run, in a new dir."""
    found = newest(checkpoint_root(run_dir))
    if found:
        return f"; to train on from it, give the new dir trainer.resume_from={found[1]}"
    if (Path(run_dir) / EXPORT / "config.json").is_file():
        return f"; to train on from it, give the new dir model.pretrained={Path(run_dir) / EXPORT}"
    return ""
