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
# align's caches (encode, reference, eval, signatures, inductor: align.core.caches) in a directory of this
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


def recorded_run(tmp_path: Path, overrides: list[str], export: bool = False):
    """A run through RunRecord as `python -m align.train` makes it (no Hydra run dir, no subprocess):
    its trainer and run dir, the manifest written."""
    from omegaconf import OmegaConf

    import align.trainer
    from align.config import to_typed
    from align.run.cli import compose
    from align.run.record import RunRecord

    ov = ["logger=none", "allow_dirty=true", f"trainer.export={str(export).lower()}", *overrides]
    cfg = compose(ov)
    typed, run_dir = to_typed(cfg), tmp_path / "run"
    record = RunRecord(typed, OmegaConf.to_container(cfg, resolve=True), run_dir, ov, ov)
    with record:
        record.start([])
        t = align.trainer.Trainer.build(typed, run_dir)
        record.built(t)
        record.finished(t, t.fit())
    return t, run_dir


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


HF_KINDS = ("llama", "qwen2", "qwen3", "phi3")
"""model_types of no align family that `model=hf` is tested on (tiny configs, built locally)."""


def tiny_hf_checkpoint(kind: str, d: Path, **config) -> Path:
    """A tiny transformers checkpoint of model_type `kind` at `d`: its own config class (a few layers,
    hidden 64; `config` replaces fields), random weights, `save_pretrained`, and the bundled tokenizer
    beside it, as `model=hf model.pretrained=<d>` loads a checkpoint. No download."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from align.config import ModelConfig
    from align.data.tokenizer import load_tokenizer

    tok = load_tokenizer(ModelConfig())
    dims = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **{**dims, **config})).save_pretrained(d)
    tok.save_pretrained(d)
    return d
