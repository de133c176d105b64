"""Helpers for the data tests: tiny corpora (the bundled tokenizer: tests/conftest.py `tokenizer`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from align.config import DataConfig


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def chat(q: str, a: str, q2: str | None = None, a2: str | None = None) -> dict:
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if q2 is not None:
        msgs += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
    return {"messages": msgs}


def data_cfg(path: Path | None, tmp_path: Path, **kw) -> DataConfig:
    """A DataConfig typed the way Hydra types it (strings become enums, values are checked)."""
    from omegaconf import OmegaConf

    base = dict(source="jsonl", path=str(path) if path else None, cache_dir=str(tmp_path / "cache"), encode_workers=0,
                max_seq_len=256)
    base.update(kw)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), base))


@pytest.fixture
def corpus(tmp_path) -> Path:
    rows = [chat(f"question {i} " + "x " * (i % 7), f"answer {i} " + "y " * (i % 5), f"again {i}", f"second {i}")
            for i in range(24)]
    return write_jsonl(tmp_path / "corpus.jsonl", rows)
