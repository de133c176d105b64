"""Shared test helpers: composing configs in-process and running align's CLIs as subprocesses."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Never touch the network from tests (docs/pitfalls.md#18), keep W&B local, keep thread counts CI-sized.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
# One intra-op thread per test process (and the subprocesses it starts): tests run many small torch
# processes side by side, and OpenMP threads spinning against each other on 2 cores cost far more
# than they win.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# align's caches (encode, reference, eval, signatures, inductor: align.run.caches) in a directory of this
# session, inherited by the CLI subprocesses: tests neither trust a user's caches nor write into them.
if "ALIGN_CACHE_DIR" not in os.environ:
    os.environ["ALIGN_CACHE_DIR"] = tempfile.mkdtemp(prefix="align-cache-")
    atexit.register(shutil.rmtree, os.environ["ALIGN_CACHE_DIR"], ignore_errors=True)


def run_cli(module: str, *args: str, cwd: Path | None = None, timeout: float = 900,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m <module> args...` and return the completed process (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def compose():
    from align.run.cli import compose as _compose

    return _compose


def build_trainer(tmp_path: Path, *overrides: str):
    """A Trainer built in-process from the composed config (no Hydra run, no subprocess)."""
    from align.config import to_typed
    from align.run.cli import compose
    from align.trainer import Trainer

    typed = to_typed(compose(["logger=none", "data.max_records=200", *overrides]))
    return Trainer.build(typed, tmp_path / "run")


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
