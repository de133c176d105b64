"""GRPO's rollout engine: which backend generates the rollouts, on which weights, and whether the MoE
router flip record can read it."""

from __future__ import annotations

from typing import Any, Optional

import torch

from align.config import GenerationDtype
from align.objectives.grpo_rollouts import GEN_DTYPES
from align.objectives.router_flips import RouterRecorder


def build_rollout_engine(cfg: Any, train_cfg: Any, model: torch.nn.Module, tokenizer: Any, env: Any
                         ) -> tuple[Any, Optional[RouterRecorder], Optional[RouterRecorder]]:
    """(engine, router recorder of the training forward, router recorder of generation). Sharded weights
    make every decode step collective: ranks then decode in lockstep until all have finished."""
    from align.generation import Backend, EngineConfig, build_engine
    from align.models.family import family_spec

    taps = family_spec(train_cfg.model).router_taps
    # The router flip record maps engine calls to rows through hf's batching (router_flips.py): a MoE
    # model under auto generates through hf; asked for align, it goes without the record.
    moe_auto = bool(taps(model)) and cfg.generation_backend == Backend.auto
    ecfg = EngineConfig(backend=Backend.hf if moe_auto else cfg.generation_backend,
                        batch_size=cfg.generation_batch_size, lockstep=bool(env and env.distributed))
    copy_dtype = None if cfg.generation_dtype == GenerationDtype.same else GEN_DTYPES[cfg.generation_dtype]
    engine = build_engine(ecfg, model, copy_dtype=copy_dtype, pad_token_id=tokenizer.pad_token_id,
                          eos_token_ids=[tokenizer.eos_token_id])
    if engine.backend == Backend.align:  # the plan sized data.max_seq_len to the longest rollout
        engine.reserve(train_cfg.data.max_seq_len, cfg.max_new_tokens)
    if moe_auto:
        engine.resolution = {"backend_requested": "auto", "backend_reason": "auto: the MoE router flip record "
                             "reads hf's batching (align/objectives/router_flips.py)"}
    if not taps(model) or engine.backend != Backend.hf:
        return engine, None, None
    return engine, RouterRecorder(model, taps(model)), RouterRecorder(engine.model, taps(engine.model))
