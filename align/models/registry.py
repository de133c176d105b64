"""The family table: which transformers classes a family uses and its size presets.

A preset is a dict of config-class kwargs (names are checked against the installed config class in
preflight). `vocab_size` and the special token ids come from the tokenizer at build time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from align.config import AttnImpl, Family


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralConfig, MistralForCausalLM


def _olmoe():
    from transformers import OlmoeConfig, OlmoeForCausalLM

    return OlmoeConfig, OlmoeForCausalLM


def _gemma4():
    # Text-only: AutoModelForCausalLM maps `gemma4` to the multimodal class, which refuses flash
    # attention (LANDMINES 4); build the text model from its text config directly.
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    return Gemma4TextConfig, Gemma4ForCausalLM


@dataclass(frozen=True)
class FamilySpec:
    name: Family
    classes: Callable[[], tuple[type, type]]
    """Lazy import of (config class, model class): importing transformers' models costs seconds."""
    presets: dict[str, dict[str, Any]]
    is_moe: bool
    attention: frozenset[AttnImpl] = field(default_factory=lambda: frozenset(AttnImpl))
    """Attention backends the family's transformers class supports at all (the machine may still lack one)."""


FAMILIES: dict[Family, FamilySpec] = {
    Family.mistral: FamilySpec(
        name=Family.mistral,
        classes=_mistral,
        is_moe=False,
        presets={
            "tiny": dict(
                hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, sliding_window=None,
            ),
        },
    ),
    Family.olmoe: FamilySpec(
        name=Family.olmoe,
        classes=_olmoe,
        is_moe=True,
        attention=frozenset({AttnImpl.sdpa, AttnImpl.eager, AttnImpl.flash}),  # no flex (LANDMINES 4)
        presets={
            "tiny": dict(
                hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
            ),
        },
    ),
    Family.gemma4: FamilySpec(
        name=Family.gemma4,
        classes=_gemma4,
        is_moe=False,
        presets={
            "tiny": dict(
                hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, sliding_window=32, max_position_embeddings=4096,
                hidden_size_per_layer_input=16,
                layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            ),
        },
    ),
}
