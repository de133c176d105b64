"""Build or load a model and record what it RESOLVED to (playbook 4.3).

Kwargs for transformers are built as dicts first so preflight can check their names against the
installed signatures before anything heavy runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from align.config import AttentionConfig, ModelConfig
from align.models.registry import FAMILIES


@dataclass
class BuiltModel:
    model: torch.nn.Module
    info: dict[str, Any] = field(default_factory=dict)
    """Requested and resolved backends, parameter counts, dtype: goes into the manifest."""


def _dtype(cfg: ModelConfig) -> torch.dtype:
    return getattr(torch, cfg.dtype or "float32")


def config_kwargs(cfg: ModelConfig, tokenizer) -> dict[str, Any]:
    """Kwargs for the family's config class when building from a preset (random init)."""
    spec = FAMILIES[cfg.family]
    if cfg.preset.value not in spec.presets:
        from align.errors import ConfigError

        raise ConfigError("model.preset", f"{cfg.family.value} has presets: {', '.join(spec.presets)}", cfg.preset.value)
    kw = dict(spec.presets[cfg.preset.value])
    kw.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    if cfg.family.value == "gemma4":
        kw["vocab_size_per_layer_input"] = len(tokenizer)
    kw.update(cfg.overrides)
    return kw


def load_kwargs(cfg: ModelConfig, attention: AttentionConfig) -> dict[str, Any]:
    """Kwargs for `from_pretrained` / `_from_config`: backends and dtype."""
    kw: dict[str, Any] = {"attn_implementation": attention.implementation.hf_name, "dtype": _dtype(cfg)}
    if FAMILIES[cfg.family].is_moe and cfg.moe.experts is not None:
        kw["experts_implementation"] = cfg.moe.experts.value
    return kw


def build_model(cfg: ModelConfig, attention: AttentionConfig, tokenizer) -> BuiltModel:
    config_cls, model_cls = FAMILIES[cfg.family].classes()
    kw = load_kwargs(cfg, attention)
    if cfg.pretrained:
        model = model_cls.from_pretrained(Path(cfg.pretrained), local_files_only=True, **kw)
    else:
        model = model_cls._from_config(config_cls(**config_kwargs(cfg, tokenizer)), **kw)
    info = describe_model(model, cfg, attention)
    return BuiltModel(model=model, info=info)


def describe_model(model: torch.nn.Module, cfg: ModelConfig, attention: AttentionConfig) -> dict[str, Any]:
    """What the model resolved to, read back from the built object, never from the request."""
    mc = model.config
    total = sum(p.numel() for p in model.parameters())
    return {
        "family": cfg.family.value,
        "model_class": type(model).__name__,
        "preset": None if cfg.pretrained else cfg.preset.value,
        "pretrained": cfg.pretrained,
        "attn_implementation_requested": attention.implementation.hf_name,
        "attn_implementation_resolved": getattr(mc, "_attn_implementation", None),
        "experts_implementation_requested": cfg.moe.experts.value if cfg.moe.experts else None,
        "experts_implementation_resolved": getattr(mc, "_experts_implementation", None) if FAMILIES[cfg.family].is_moe else None,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "params_total": total,
        "vocab_size": mc.vocab_size,
    }
