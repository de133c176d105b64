"""Checkpoints: the resume hand-off when the run is built (which checkpoint, refused when it is
another run's, loaded into every component) and the writes while it trains (every
`trainer.save_every` steps, and on a stop) - align/control/checkpoint.py writes and reads them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.checkpoint.api import CheckpointException

from align.callbacks.callback import Callback
from align.callbacks.nonfinite_halt import check_parameters
from align.config import TrainConfig
from align.control.checkpoint import load_checkpoint, read_meta, remove_stale_tmp, save_checkpoint
from align.control.ckpt_index import broken, checkpoint_root
from align.control.resume import check_resumable, resume_points, run_identity
from align.errors import ConfigError, StopRequested

log = logging.getLogger("align")


class Checkpoints(Callback):
    def post_step(self, step: int, stopping: bool) -> None:
        t = self.trainer
        if stopping or (t.cfg.trainer.save_every and step % t.cfg.trainer.save_every == 0):
            save(t, "stop" if stopping else "cadence")
            t.t_boundary = None  # a checkpoint is not training time


def save(t: Any, reason: str) -> Path:
    t.stepper.sync()  # the last step's parameters and moments may still be written on a side stream
    check_parameters(t, f"the {reason} checkpoint was not written")
    meta = {"reason": reason, "identity": t.identity, "state": t.state.to_dict(),
            "scheduler": t.scheduler.state_dict(), "optimizer_impl": t.model_info["optimizer_impl"],
            "objective": t.objective.state_dict()}
    path = save_checkpoint(checkpoint_root(t.run_dir), t.state.step, t.model, t.optimizer, t.env, meta,
                           {"stream": t.stream.state_dict(), "objective": t.objective.rank_state_dict()},
                           t.cfg.trainer.keep_last)
    log.info("checkpoint %s (%s)", path, reason)
    return path


def resume_decision(cfg: TrainConfig, run_dir: Path, world: int, data: Any, model: torch.nn.Module
                    ) -> tuple[dict[str, Any], list[Path]]:
    """This run's identity (what its checkpoints record and a resume must match: align/control/resume.py)
    and the checkpoints it may continue, newest first (none: a fresh start). The newest is refused here
    when it is another run's, before any sharding or loading."""
    identity = run_identity(cfg, world, data, model)
    resume = resume_points(cfg, run_dir)
    if resume:
        check_resumable(resume[0], read_meta(resume[0]), identity, cfg.trainer.resume_despite_mismatch)
    return identity, resume


def hand_off(t: Any, candidates: list[Path]) -> None:
    """Once the resume is decided: the checkpoint loaded when resuming, then the leftovers of a write
    that never completed removed (rank 0)."""
    if candidates:
        restore(t, candidates)
    if t.env.is_main:
        remove_stale_tmp(checkpoint_root(t.run_dir))


def restore(t: Any, candidates: list[Path]) -> None:
    """Continue from the first of `candidates` (newest first) that loads; each one skipped, and why,
    goes to the log and to `model_info["resumed_from"]` (the manifest). None loads: refused (exit 2)."""
    skipped: list[dict[str, str]] = []
    for path in candidates:
        if skipped:  # the first was checked against this run before sharding
            check_resumable(path, read_meta(path), t.identity, t.cfg.trainer.resume_despite_mismatch)
        why = load(t, path)
        if why is None:
            break
        log.warning("checkpoint %s does not load (%s); trying the next older one", path, why)
        skipped.append({"path": str(path), "why": why})
    else:
        key = "trainer.resume_from" if t.cfg.trainer.resume_from else "trainer.resume"
        raise ConfigError(key, "no checkpoint loads: " + "; ".join(f"{s['path']}: {s['why']}" for s in skipped)
                          + " (move them aside, or set trainer.resume=never to start afresh)")
    newer = [{"path": str(p), "why": why} for s, p, why in broken(checkpoint_root(t.run_dir)) if s > t.state.step]
    skipped = newer + skipped
    for s in newer:
        log.warning("checkpoint %s skipped: %s", s["path"], s["why"])
    t.model_info["resumed_from"] = {"path": str(path), "step": t.state.step, "skipped": skipped}
    log.info("resumed from %s at step %d", path, t.state.step)


def load(t: Any, path: Path) -> Optional[str]:
    """Restore everything from `path` (collective: every rank gets the same outcome); None when it
    loaded, else why not, in one line."""
    try:
        meta, mine = load_checkpoint(path, t.model, t.optimizer, t.env)
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        if t.stop.requested:  # a stop signal cut the load short: not the checkpoint's fault
            raise StopRequested(f"stop requested ({t.stop.reason}) while loading {path}") from e
        return load_failure(e)
    t.scheduler.load_state_dict(meta["scheduler"])
    t.objective.load_state_dict(meta.get("objective", {}))
    t.state = t.state.from_dict(meta["state"])
    t.stream.load_state_dict(mine["stream"], strict=not t.cfg.trainer.resume_despite_mismatch)
    t.objective.load_rank_state_dict(mine.get("objective", {}))
    return None


def load_failure(e: BaseException) -> str:
    """One line for a checkpoint that did not load; DCP's CheckpointException carries each failed
    rank's own exception (its str is a multi-line traceback)."""
    where = ""
    if isinstance(e, CheckpointException) and e.failures:
        where = f" on rank(s) {sorted(e.failures)}"
        e = next(iter(e.failures.values()))[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
    return f"{type(e).__name__}{where}: {text}"[:300]
