"""align's caches default to a user cache directory, never the working directory: $ALIGN_CACHE_DIR,
else $XDG_CACHE_HOME/align, else ~/.cache/align; a config key or a cache's own variable wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from align.config import ModelConfig
from align.core import caches, signatures
from tests.unit.data.conftest import chat, data_cfg, write_jsonl


@pytest.fixture
def xdg(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv(caches.CACHE_ENV, raising=False)
    monkeypatch.delenv(signatures.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "align"


def test_every_cache_defaults_under_xdg_cache_home(xdg):
    from align.parallel.compile import apply_cache_dir

    assert caches.cache_home() == (xdg, "$XDG_CACHE_HOME/align")
    assert caches.encode_location(None) == {"dir": str(xdg / "encode"), "source": "$XDG_CACHE_HOME/align/encode"}
    assert caches.cache_location("eval") == {"dir": str(xdg / "eval"), "source": "$XDG_CACHE_HOME/align/eval"}
    assert signatures.cache_dir() == xdg / "signatures"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        assert apply_cache_dir()["dir"] == str(xdg / "inductor")


def test_without_xdg_cache_home_it_is_home_dot_cache(tmp_path, monkeypatch, xdg):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert caches.cache_home() == (tmp_path / "home" / ".cache" / "align", "~/.cache/align")


def test_align_cache_dir_beats_xdg_and_a_config_key_beats_both(tmp_path, monkeypatch, xdg):
    monkeypatch.setenv(caches.CACHE_ENV, str(tmp_path / "mine"))
    assert caches.encode_location(None) == {"dir": str(tmp_path / "mine" / "encode"),
                                            "source": "$ALIGN_CACHE_DIR/encode"}
    assert signatures.cache_dir() == tmp_path / "mine" / "signatures"
    assert caches.encode_location(str(tmp_path / "cfg")) == {"dir": str(tmp_path / "cfg"), "source": "data.cache_dir"}
    assert caches.cache_location("eval", "/e", "eval.cache_dir") == {"dir": "/e", "source": "eval.cache_dir"}


def test_the_encode_cache_is_written_under_the_user_cache_not_the_working_directory(tmp_path, monkeypatch, xdg,
                                                                                   tokenizer):
    from align.data.encode_cache import load_dataset

    corpus = write_jsonl(tmp_path / "c.jsonl", [chat("2+2?", "4"), chat("3+3?", "6")])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    data = load_dataset(data_cfg(corpus, tmp_path, cache_dir=None), ModelConfig(), tokenizer)
    assert Path(data.meta["cache_entry"]) == xdg / "encode" / data.meta["encode_cache_key"]
    assert (Path(data.meta["cache_entry"]) / "meta.json").is_file()
    assert list(work.iterdir()) == []
