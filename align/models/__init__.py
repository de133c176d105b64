"""Model families: transformers' own classes, built from a preset with random init or loaded from a
local HF checkpoint. Every `if family == ...` branch of align lives in this package.

    family_spec      which family a model config builds (model=hf: its checkpoint's; align.models.family)
    build_model      build/load, resolve backends, wrap LoRA, attach router telemetry (BuiltModel)
    model_checks     preflight: kwargs by name, attention, QLoRA/MoE refusals, params and memory
    export_hf        HF-layout export (LoRA merged)
    verify_export    the round-trip gate (align.models.roundtrip)
"""

from align.models.family_table import FAMILIES, FamilySpec

__all__ = ["BuiltModel", "build_model", "FAMILIES", "FamilySpec"]


def __getattr__(name: str):
    # build_model on first use: preflight imports align.models.attention, .kwargs and .registry, and
    # a refusal must not pay for the torch import that align.models.build makes.
    if name in ("BuiltModel", "build_model"):
        from align.models import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
