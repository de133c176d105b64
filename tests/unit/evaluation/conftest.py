"""A tiny random-init export made with the project's own build and export code, and eval configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from align.evaluation.config import EvalConfig, EvalRunConfig


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> Path:
    import torch

    from align.config import AttentionConfig, ModelConfig
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model
    from align.models.export import export_hf

    tok = load_tokenizer(ModelConfig())
    torch.manual_seed(0)
    model = build_model(ModelConfig(), AttentionConfig(), tok, torch.device("cpu")).model
    return export_hf(model, tok, tmp_path_factory.mktemp("model") / "export")


def run_config(model_dir, tmp_path: Path, **eval_kw) -> EvalRunConfig:
    """A root config as Hydra would give it: allow_dirty (tests run in a working tree), a private cache."""
    kw = {"limit": 3, "max_new_tokens": 8, "cache_dir": str(tmp_path / "cache"), **eval_kw}
    return EvalRunConfig(model_dir=None if model_dir is None else str(model_dir), eval=EvalConfig(**kw),
                         allow_dirty=True)
