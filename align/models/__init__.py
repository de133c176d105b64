"""Model families: transformers' own classes, built from a preset with random init or loaded from a
local HF checkpoint. Every `if family == ...` branch of align lives in this package."""

from align.models.build import BuiltModel, build_model
from align.models.registry import FAMILIES, FamilySpec

__all__ = ["BuiltModel", "build_model", "FAMILIES", "FamilySpec"]
