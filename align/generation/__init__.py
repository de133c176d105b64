"""Generation for evaluation and RL rollouts: one interface, backends behind it.

    SamplingSpec, Completion, Engine   the interface (align.generation.engine; log-prob definitions there)
    EngineConfig, GenerateMode         how an engine runs (cache, compile, batch size)
    build_engine                       the engine `EngineConfig.backend` names, on a given model
    HFEngine                           transformers' `generate` (align.generation.hf)
    AlignEngine                        align's own decode loop (align.generation.align_engine)

An external engine (vLLM, SGLang) joins as a `Backend` value and a class implementing `Engine`, where it
is installed and tested; only the transformers backend ships.
"""

from __future__ import annotations

from typing import Any, Sequence

from align.generation.engine import (
    Backend,
    Completion,
    Engine,
    EngineConfig,
    FinishReason,
    GenerateMode,
    SamplingSpec,
    derive_seed,
    resolve_mode,
)

__all__ = ["AlignEngine", "Backend", "Completion", "Engine", "EngineConfig", "FinishReason", "GenerateMode", "HFEngine",
           "SamplingSpec", "build_engine", "derive_seed", "resolve_mode"]


def build_engine(cfg: EngineConfig, model: Any, *, pad_token_id: int, eos_token_ids: Sequence[int]) -> Engine:
    """The engine `cfg.backend` names, generating with `model` (shared, not copied)."""
    backends = {Backend.hf: _hf, Backend.align: _align}
    return backends[cfg.backend]()(model, cfg, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids)


def _hf():
    from align.generation.hf import HFEngine

    return HFEngine


def _align():
    from align.generation.align_engine import AlignEngine

    return AlignEngine


def __getattr__(name: str):
    # HFEngine on first use: the interface and its config are importable without torch/transformers.
    if name == "HFEngine":
        return _hf()
    if name == "AlignEngine":
        return _align()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
