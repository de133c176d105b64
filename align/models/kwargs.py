"""Kwargs for the family's config class and for `from_pretrained` / `_from_config`, built as data:
the build calls them, and preflight checks their names against the installed signatures
(align.run.kwargs_sites). Imports neither torch nor transformers, so preflight can build them first
(under model=hf, a model_type no family loads is resolved through transformers: align.models.family)."""

from __future__ import annotations

from typing import Any, Optional

from align.config import AttentionConfig, ModelConfig
from align.errors import ConfigError
from align.models.attention import AttentionChoice
from align.models.family import family_spec
from align.models.family_table import MoEShape


def preset_kwargs(cfg: ModelConfig, vocab_size: Optional[int] = None,
                  special: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Kwargs for the family's config class when building from a preset (random init).

    `vocab_size` is the tokenizer's; a preset that names its own (the `full` presets) keeps it, and
    it must hold the tokenizer."""
    spec = family_spec(cfg)
    if cfg.preset.value not in spec.presets:
        raise ConfigError("model.preset", f"{cfg.family.value} has presets: {', '.join(spec.presets)}",
                          cfg.preset.value)
    kw = dict(spec.presets[cfg.preset.value])
    kw.setdefault("tie_word_embeddings", False)
    if vocab_size is not None:
        preset_vocab = kw.get("vocab_size")
        if preset_vocab is not None and preset_vocab < vocab_size:
            raise ConfigError("model.preset", f"{cfg.family.value}/{cfg.preset.value} has {preset_vocab} embeddings, "
                              f"fewer than the tokenizer's {vocab_size} tokens", cfg.preset.value)
        kw["vocab_size"] = preset_vocab or vocab_size
    kw.update(special or {})
    if spec.extra_config_kwargs and "vocab_size" in kw:  # Gemma-4's per-layer-input table follows the vocab
        kw["vocab_size_per_layer_input"] = kw["vocab_size"]
    kw.update(cfg.overrides)
    return kw


def config_kwargs(cfg: ModelConfig, tokenizer) -> dict[str, Any]:
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    return preset_kwargs(cfg, len(tokenizer), special)


_FROM_FAMILY: Any = object()


def load_kwargs(cfg: ModelConfig, attention: AttentionChoice | AttentionConfig,
                moe: Optional[MoEShape] = _FROM_FAMILY) -> dict[str, Any]:
    """Kwargs for `from_pretrained` / `_from_config`: backends and dtype. Preflight's kwargs site
    passes the requested AttentionConfig and no `moe` (then the family's presets say MoE or not)."""
    spec = family_spec(cfg)
    impl = attention.hf_name if isinstance(attention, AttentionChoice) else attention.chosen(spec.name).hf_name
    # A dtype NAME: transformers resolves it with getattr(torch, name); this module stays torch-free.
    kw: dict[str, Any] = {"attn_implementation": impl, "dtype": cfg.dtype or "float32"}
    is_moe = spec.is_moe if moe is _FROM_FAMILY else moe is not None
    if is_moe and cfg.moe.experts is not None:
        kw["experts_implementation"] = cfg.moe.experts.value
    return kw


REPORT_KWARGS: dict[str, Any] = {"output_loading_info": True, "ignore_mismatched_sizes": True}
"""Added to every `from_pretrained` of a checkpoint (align.models.checkpoint_fit.load_checked): the
load report is returned, and tensors of another shape are listed in it rather than raised on, so the
refusal can name them. A checkpoint with any is refused all the same."""
