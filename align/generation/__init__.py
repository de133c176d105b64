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

from align.errors import ConfigError
from align.generation.engine import (
    Backend,
    Completion,
    Engine,
    EngineConfig,
    FinishReason,
    GenerateMode,
    SamplingSpec,
    derive_seed,
    resolve_backend,
    resolve_mode,
)

__all__ = ["AlignEngine", "Backend", "Completion", "Engine", "EngineConfig", "FinishReason", "GenerateMode", "HFEngine",
           "SamplingSpec", "build_engine", "derive_seed", "resolve_backend", "resolve_mode"]


def build_engine(cfg: EngineConfig, model: Any, *, pad_token_id: int, eos_token_ids: Sequence[int],
                 copy: bool = False, copy_dtype: Any = None) -> Engine:
    """The engine `cfg.backend` resolves to, generating with `model` (shared), or with its own copy of it
    (`copy`, optionally cast to `copy_dtype`) kept current by `sync_from`. Under auto, a model whose
    attention layers align's cache cannot address (no `k_proj`) generates through hf; `describe()` says
    which backend was asked for, which runs, and why."""
    backend, reason = resolve_backend(cfg)
    if backend is Backend.align:
        from align.generation.align_engine import unsupported

        why = unsupported(model)
        if why is not None and cfg.backend is Backend.auto:
            backend, reason = Backend.hf, f"auto: {why}"
        elif why is not None:
            raise ConfigError("generation.backend", f"align's engine cannot run this model ({why}); use hf or auto",
                              cfg.backend.value)
    cls = {Backend.hf: _hf, Backend.align: _align}[backend]()
    kw = dict(pad_token_id=pad_token_id, eos_token_ids=eos_token_ids)
    copied = copy or copy_dtype is not None
    engine = cls.copy_of(model, cfg, dtype=copy_dtype, **kw) if copied else cls(model, cfg, **kw)
    engine.resolution = {"backend_requested": cfg.backend.value, "backend_reason": reason}
    return engine


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
