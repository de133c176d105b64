"""Eval configs for the evaluation tests (the tiny export they evaluate: tests/conftest.py `tiny_export`)."""

from __future__ import annotations

from pathlib import Path

from align.evaluation.config import EvalConfig, EvalRunConfig


def run_config(model_dir, tmp_path: Path, **eval_kw) -> EvalRunConfig:
    """A root config as Hydra would give it: allow_dirty (tests run in a working tree), a private cache."""
    kw = {"limit": 3, "max_new_tokens": 8, "cache_dir": str(tmp_path / "cache"), **eval_kw}
    return EvalRunConfig(model_dir=None if model_dir is None else str(model_dir), eval=EvalConfig(**kw),
                         allow_dirty=True)
