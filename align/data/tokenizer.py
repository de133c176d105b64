"""The tokenizer: the small BPE bundled for the tiny presets, or the checkpoint's own."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from align.config import ModelConfig
from align.errors import ConfigError


def bundled_tokenizer_dir() -> Path:
    return Path(str(resources.files("align.data") / "assets" / "tokenizer"))


def tokenizer_dir(cfg: ModelConfig) -> Path:
    return Path(cfg.pretrained) if cfg.pretrained else bundled_tokenizer_dir()


def load_tokenizer(cfg: ModelConfig):
    from transformers import AutoTokenizer

    path = tokenizer_dir(cfg)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not tok.chat_template:
        raise ConfigError("model.pretrained",
                          f"tokenizer in {path} has no chat template; SFT renders records through it")
    if tok.eos_token_id is None:
        raise ConfigError("model.pretrained", f"tokenizer in {path} has no EOS token")
    if tok.pad_token_id is None:
        # Padding positions are masked out of attention and loss, so any id works; EOS is the convention.
        tok.pad_token = tok.eos_token
    return tok
