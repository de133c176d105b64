"""Model families: transformers' own classes, built from a preset with random init or loaded from a
local HF checkpoint. Every `if family == ...` branch of align lives in this package.

    build_model      build/load, resolve backends, wrap LoRA, attach router telemetry (BuiltModel)
    model_checks     preflight: kwargs by name, attention, QLoRA/MoE refusals, params and memory
    export_hf        HF-layout export (LoRA merged)
    verify_export    the round-trip gate (align.models.roundtrip)
"""

from align.models.build import BuiltModel, build_model
from align.models.registry import FAMILIES, FamilySpec

__all__ = ["BuiltModel", "build_model", "FAMILIES", "FamilySpec"]
