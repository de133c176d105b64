"""Which family a model config builds: its own, or under `model=hf` the one its checkpoint picks.

`model=hf` takes any local transformers causal-LM checkpoint. A `model_type` one of align's families
loads (`FamilySpec.fits`: mistral, olmoe, gemma4_text told apart by its MoE block) resolves to that
family, and the run is the one `model=<family>` would make with that checkpoint: its attention
choice, router taps, compile rules. Any other `model_type` gets the generic spec: the config and
model classes transformers' own auto mappings give it (`AutoConfig`, `AutoModelForCausalLM`), the
attention backends the class's `_supports_*` flags name (auto: sdpa), MoE or not as its config
declares experts, and no router taps (align knows no other router modules: no router losses, no
router telemetry). Knowing whether transformers maps a `model_type` to a causal LM imports
transformers, so under `model=hf` preflight's family check does.

Every place that asks which family a config builds asks `family_spec` / `family_of`, never
`cfg.family` itself: under `model=hf` that says only "hf".
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

from align.config import AttnImpl, Family, ModelConfig
from align.errors import ConfigError
from align.models.family_table import FAMILIES, FamilySpec, MoEShape, _Attrs


def checkpoint_config(d: str | Path) -> Optional[dict[str, Any]]:
    """config.json of the checkpoint dir `d` as a dict, or None when it does not parse as one (the file
    checks, align.models.checkpoint_files.checkpoint_problem, say why)."""
    try:
        value = json.loads((Path(d) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def align_family(config: dict[str, Any]) -> Optional[Family]:
    """The family of align that loads a checkpoint with this config.json, if one does."""
    return next((f for f, spec in FAMILIES.items() if spec.fits(config)), None)


def causal_lm_classes(model_type: str) -> Optional[tuple[str, str]]:
    """(config class, model class) names transformers' auto mappings give `model_type`; None when
    `AutoModelForCausalLM` maps it to no class (imports transformers)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config, model = CONFIG_MAPPING_NAMES.get(model_type), MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return (config, model) if config and model else None


def generic_moe_shape(config: Any) -> Optional[MoEShape]:
    """Experts and top-k of a config align has no family for, under the names transformers' MoE configs
    use (`num_local_experts`: Mixtral; `num_experts`: Qwen2-MoE, Qwen3-MoE; `num_experts_per_tok`);
    None for a dense model."""
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    return MoEShape(experts, top_k) if experts and top_k else None


_FLAGS = ((AttnImpl.sdpa, "_supports_sdpa"), (AttnImpl.flash, "_supports_flash_attn"),
          (AttnImpl.flex, "_supports_flex_attn"))


@functools.lru_cache(maxsize=None)
def generic_spec(model_type: str, moe: bool) -> FamilySpec:
    """The spec `model=hf` builds a `model_type` of no align family with (see the module docstring)."""
    from align.core.signatures import resolve

    names = causal_lm_classes(model_type)
    if names is None:
        raise ValueError(f"transformers maps model_type {model_type!r} to no causal-LM class")
    config_class, model_class = (f"transformers:{n}" for n in names)
    cls = resolve(model_class)
    attention = frozenset({AttnImpl.eager} | {impl for impl, flag in _FLAGS if getattr(cls, flag, False)})
    return FamilySpec(name=Family.hf, config_class=config_class, model_class=model_class, presets={},
                      attention=attention, moe_shape=generic_moe_shape, fused_experts=moe, model_type=model_type,
                      checkpoint_moe=moe)


def family_spec(m: ModelConfig) -> FamilySpec:
    """The spec `m` builds: its family's, or under `model=hf` the one its checkpoint's config.json picks.
    A checkpoint that picks none is ConfigError (preflight's family check names why first)."""
    if m.family != Family.hf:
        return FAMILIES[m.family]
    config = checkpoint_config(m.pretrained) if m.pretrained else None
    model_type = (config or {}).get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError("model.pretrained", f"model=hf reads the model_type from {m.pretrained}/config.json, "
                          "which gives none", m.pretrained)
    family = align_family(config)
    if family is not None:
        return FAMILIES[family]
    if causal_lm_classes(model_type) is None:
        raise ConfigError("model.pretrained", f"model=hf trains causal LMs: transformers maps model_type "
                          f"{model_type!r} to no AutoModelForCausalLM class", m.pretrained)
    return generic_spec(model_type, generic_moe_shape(_Attrs(config)) is not None)


def as_spec(family: Family | FamilySpec) -> FamilySpec:
    """A family's spec, or a spec as given (one `family_spec` resolved)."""
    return FAMILIES[family] if isinstance(family, Family) else family


def family_of(m: ModelConfig) -> Family:
    """The family `m` builds (under `model=hf`: the one its checkpoint picks, or hf itself)."""
    return family_spec(m).name
