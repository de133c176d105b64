"""Shared test helpers: composing configs in-process and running align's CLIs as subprocesses."""

from __future__ import annotations

import atexit
import functools
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


@functools.cache
def bundled_tokenizer():
    """The tokenizer of the tiny presets (align/data/assets/tokenizer), loaded once per test process. Tests only
    read it; one that changes a tokenizer loads its own with align.data.tokenizer.load_tokenizer."""
    from align.config import ModelConfig
    from align.data.tokenizer import load_tokenizer

    return load_tokenizer(ModelConfig())


@pytest.fixture(scope="session")
def tokenizer():
    """The bundled tokenizer, shared by the session (bundled_tokenizer)."""
    return bundled_tokenizer()


def build_tiny(family=None, attention=None, seed: int = 0, **model):
    """The tests' model builder: build_model's result (`.model`, `.info`), fp32 on the CPU, random init under
    torch.manual_seed(seed), with the bundled tokenizer. `family`: a Family (its tiny preset; mistral by default)
    or a whole ModelConfig (a composed run's `cfg.model`); `attention` is an AttentionConfig; `model` sets
    ModelConfig fields (moe=, lora=, pretrained=, overrides=, dtype=...). No download."""
    import dataclasses

    import torch

    from align.config import AttentionConfig, Family, ModelConfig
    from align.models import build_model

    if isinstance(family, ModelConfig):
        cfg = dataclasses.replace(family, **model)
    else:
        cfg = ModelConfig(family=family or Family.mistral, **model)
    torch.manual_seed(seed)
    return build_model(cfg, attention or AttentionConfig(), bundled_tokenizer(), torch.device("cpu"))


@pytest.fixture
def build():
    """build_tiny, for the tests that take their builder as a fixture."""
    return build_tiny


@pytest.fixture(scope="session")
def tiny_model():
    """tiny_model(family) -> build_tiny(family).model, built once per family for the session: for tests
    that only read the model (forwards under no_grad, exports)."""
    built = {}

    def _get(family=None):
        from align.config import Family

        family = family or Family.mistral
        if family not in built:
            built[family] = build_tiny(family).model
        return built[family]

    return _get


def tiny_checkpoint(d: Path, family=None, **model) -> Path:
    """build_tiny(family, **model)'s model saved with `save_pretrained` at `d`, the bundled tokenizer beside
    it: a checkpoint that `model.pretrained=<d>` loads."""
    build_tiny(family, **model).model.save_pretrained(d)
    bundled_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_export(tiny_model, tmp_path_factory) -> Path:
    """The default tiny model (mistral, seed 0) as `align.train` exports it, written by the project's
    export code once for the session."""
    from align.models.export import export_hf

    return export_hf(tiny_model(), bundled_tokenizer(), tmp_path_factory.mktemp("model") / "export")


HF_KINDS = ("llama", "qwen2", "qwen3", "phi3")
"""model_types of no align family that `model=hf` is tested on (tiny configs, built locally)."""


def tiny_hf_checkpoint(kind: str, d: Path, weights: bool = True, **config) -> Path:
    """A tiny transformers checkpoint of model_type `kind` at `d`: its own config class (a few layers,
    hidden 64; `config` replaces fields), random weights, `save_pretrained`, and the bundled tokenizer
    beside it, as `model=hf model.pretrained=<d>` loads a checkpoint. No download. `weights=False`: only
    its config.json, naming the causal-LM class transformers maps `kind` to (for the checks that read no
    weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    tok = bundled_tokenizer()
    dims = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = AutoConfig.for_model(kind, **{**dims, **config})
    if not weights:
        cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[kind]]
        cfg.save_pretrained(d)
        return d
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d
