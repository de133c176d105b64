"""Checks of an eval that need no model load, run for every job of the command line (align/eval.py) before Hydra
creates a run dir: a refusal is one line, exit 2, and leaves nothing behind.

Cheapest first: values (in `to_typed`), the model dirs (files only: align.train's checkpoint file
checks on each, and a training checkpoint's run config and base), the records (every prompt field
present, every reference readable by the verifier), the git tree, then the names of the kwargs the
eval passes to W&B (read from the installed signature).
"""

from __future__ import annotations

from pathlib import Path

from align.evaluation.config import EvalRunConfig


def check(cfg: EvalRunConfig, root: Path | None = None) -> None:
    """Raise ConfigError (exit 2) on the first problem."""
    from align.errors import ConfigError
    from align.evaluation.datasets import load_data
    from align.evaluation.model_source import resolve_source
    from align.evaluation.scoring import build_scorer

    ev = cfg.eval
    if not ev.oracle:
        resolve_source(cfg.model_dir, "model_dir")
        if ev.compare_to:
            resolve_source(ev.compare_to, "eval.compare_to")
    scorer = build_scorer(ev)
    load_data(ev, getattr(scorer, "verifier", None))
    _check_git(cfg, root)
    _check_logger(cfg)
    if cfg.device.value == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for but torch sees no CUDA device; use device=auto or cpu")


def _check_git(cfg: EvalRunConfig, root: Path | None) -> None:
    from align.core.provenance import git_state
    from align.errors import ConfigError

    g = git_state(root)
    if g.commit is not None and g.dirty and not cfg.allow_dirty:
        files = ", ".join((g.changed or [])[:5]) + (" ..." if len(g.changed or []) > 5 else "")
        raise ConfigError("git", f"refusing to start: working tree {g.root} has uncommitted changes ({files}); "
                                 f"eval.json's commit {g.commit[:12]} would not describe this code. Commit, or pass "
                                 "allow_dirty=true")


def _check_logger(cfg: EvalRunConfig) -> None:
    from align.config import LoggerKind

    if cfg.logger.kind == LoggerKind.none:
        return
    from align.core.signatures import check_kwargs
    from align.telemetry.wandb_logger import wandb_init_kwargs

    check_kwargs("wandb:init", wandb_init_kwargs(cfg.logger, Path("."), "preflight", None, {}), "logger")
