"""GRPO's rollout engine: which backend generates the rollouts, on which weights, and how the MoE router
flip record reads the generation's routing."""

from __future__ import annotations

from typing import Any, Optional

import torch

from align.config import GenerationDtype
from align.objectives.grpo_rollouts import GEN_DTYPES
from align.objectives.router_flips import RouterRecorder


def build_rollout_engine(cfg: Any, train_cfg: Any, model: torch.nn.Module, tokenizer: Any, env: Any,
                         record_routers: bool = True, multi_turn: bool = False
                         ) -> tuple[Any, Optional[RouterRecorder], Optional[RouterRecorder]]:
    """(engine, router recorder of the training forward, router recorder of generation). Sharded weights
    make every decode step collective: ranks then decode in lockstep until all have finished. A MoE policy
    with `record_routers` has its generation's routing recorded for the router flip record: align's engine
    writes it beside each token on the device (`AlignEngine.record_routers`; no generation recorder), hf's
    through forward hooks mapped back to rows by its batching (router_flips.py `generation_topk`), which reads
    one call's rows: over `multi_turn` trajectories, of several calls each, hf records nothing."""
    from align.generation import Backend, EngineConfig, build_engine
    from align.models.family import family_spec

    taps = family_spec(train_cfg.model).router_taps
    ecfg = EngineConfig(backend=cfg.generation_backend, batch_size=cfg.generation_batch_size,
                        lockstep=bool(env and env.distributed))
    copy_dtype = None if cfg.generation_dtype == GenerationDtype.same else GEN_DTYPES[cfg.generation_dtype]
    engine = build_engine(ecfg, model, copy_dtype=copy_dtype, pad_token_id=tokenizer.pad_token_id,
                          eos_token_ids=[tokenizer.eos_token_id])
    if engine.backend == Backend.align:  # the plan sized data.max_seq_len to the longest rollout
        engine.reserve(train_cfg.data.max_seq_len, cfg.max_new_tokens)
    if not record_routers or not taps(model):
        return engine, None, None
    if engine.backend == Backend.align:
        engine.record_routers(taps(engine.model))
        return engine, RouterRecorder(model, taps(model)), None
    if multi_turn:
        return engine, None, None
    return engine, RouterRecorder(model, taps(model)), RouterRecorder(engine.model, taps(engine.model))
