"""torch.compile per decoder block (torchtitan's granularity): each block compiles once and is
reused by every layer of its class; the loss, the optimizer and the data path stay eager.

torch is imported inside the functions: `compile_kwargs` is also preflight's kwargs builder, which
runs before any heavy import (align.run.kwargs_sites)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from align.core.caches import cache_location
from align.parallel import compile_artifacts

COMPILE = "torch:compile"
"""The callable `nn.Module.compile` hands its kwargs to: the name preflight checks them against."""


def compile_kwargs(dynamic: Optional[bool]) -> dict[str, Any]:
    return {"dynamic": dynamic}


def compile_blocks(model, dynamic: Optional[bool], backend: str = "inductor") -> dict[str, Any]:
    """Compile every decoder block in place, before sharding (fully_shard wraps the compiled block).
    `dynamic`: trainer.compile_dynamic (its default lives in the config only). `backend`: the CPU
    tests use "eager" (dynamo's guards and recompiles, no code generation)."""
    import torch._dynamo.config

    from align.parallel.fsdp import decoder_blocks

    blocks = decoder_blocks(model)
    kwargs = compile_kwargs(dynamic)
    # A compiled block under activation checkpointing is traced as one checkpoint region, which cannot
    # hold a graph break or, by default, a write to Python state (the router hooks leave their
    # tensors on the routers; Gemma-4's attention stores its keys and values for layers that share
    # them): either sends the whole block to eager. Those writes belong to the forward only, and the
    # recompute in backward must not repeat them, which is what this setting says.
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    # The record reads dynamo's config back instead of restating the constant, so the manifest cannot
    # claim a rule dynamo is not running.
    forward_only = torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint is True
    for block in blocks:
        block.compile(backend=backend, **kwargs)
    return {"blocks": len(blocks), "block_class": type(blocks[0]).__name__, "granularity": "decoder block",
            "checkpoint_side_effects": "forward only" if forward_only else "forward and backward", **kwargs}


def apply_compile(cfg: Any) -> dict[str, Any]:
    """What the resolved switches of `cfg` set in this process before anything compiles, each recorded
    (the manifest's `compile.inductor_cache`, `compile.artifacts`, `compile.memory_budget`): where
    anything compiles, the persistent inductor cache (`apply_cache_dir`) and the portable artifacts of
    `trainer.compile_artifacts`; where the blocks compile, the partitioner's memory budget."""
    compiling = cfg.trainer.compile or cfg.optimizer.compile
    return {"inductor_cache": apply_cache_dir() if compiling else None,
            "artifacts": compile_artifacts.load(cfg.trainer.compile_artifacts) if compiling else None,
            "memory_budget": apply_memory_budget(cfg.trainer.compile_memory_budget) if cfg.trainer.compile else None}


MEMORY_BUDGET = "activation_memory_budget"
"""The name of the partitioner's knob in torch._functorch.config that trainer.compile_memory_budget sets."""


def apply_memory_budget(requested: Optional[float]) -> dict[str, Any]:
    """Set the partitioner's activation memory budget for this process before anything compiles:
    `requested`, or torch's own default where it is null (a run never inherits an earlier run's value
    in the same process). Refused in one line where this torch has no such knob. The record reads the
    value back from torch."""
    import torch._functorch.config as functorch_config

    from align.config.trainer_config import require_memory_budget_resolved
    from align.errors import ConfigError

    require_memory_budget_resolved(requested, "the compile")
    if not hasattr(functorch_config, MEMORY_BUDGET):
        if requested is None:
            return {"requested": None, "applied": None, "why": f"this torch has no {MEMORY_BUDGET}"}
        raise ConfigError("trainer.compile_memory_budget", f"this torch has no torch._functorch.config.{MEMORY_BUDGET} "
                          "(set it to null)", requested)
    # 1 is the knob's definition of the partitioner's own runtime-optimized choice, not a tuned number.
    setattr(functorch_config, MEMORY_BUDGET, float(1 if requested is None else requested))
    applied = getattr(functorch_config, MEMORY_BUDGET)
    return {"requested": requested, "applied": applied,
            "why": "torch's default" if requested is None else "trainer.compile_memory_budget"}


# ------------------------------------------------------------------------------ cost, cache


CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def apply_cache_dir() -> dict[str, str]:
    """Point inductor's on-disk caches (FX graphs, generated kernels, autotune results, and Triton's
    under it) at a directory that outlives the run, unless the environment names one (the user's
    wins): torch's own default lives under /tmp, which a reboot or a fresh container empties."""
    if os.environ.get(CACHE_ENV):
        return {"dir": os.environ[CACHE_ENV], "source": f"${CACHE_ENV} from the environment"}
    where = cache_location("inductor")
    os.environ[CACHE_ENV] = where["dir"]
    return where


def block_variants(config: Any) -> int:
    """How many guard sets the one frame of every compiled block meets: one per layer type (each type's
    head and rotary shapes differ), and one more per windowed type, whose attention takes a mask past
    its window and none within it. `config`: the model's (text) config."""
    types = list(dict.fromkeys(getattr(config, "layer_types", None) or ["full_attention"]))
    windowed = sum("sliding" in t for t in types) if getattr(config, "sliding_window", None) else 0
    return len(types) + windowed


def expected_compiles_per_frame(trainer_compile: bool, dynamic: Optional[bool],
                                recompile_limit: Optional[int], variants: int = 1) -> Optional[int]:
    """How many graphs one frame may compile before it is worth a warning: a dynamic block compiles once
    per variant (`block_variants`), plus once for a one-row batch (dynamo specialises sizes 0 and 1);
    `dynamic=null` adds the compile that turns it dynamic. `dynamic=false` compiles a graph per shape: no
    count to expect (None). The overlapped compiled optimizer compiles up to its raised `recompile_limit`
    graphs in one frame."""
    if trainer_compile and dynamic is False:
        return None
    blocks = (2 if dynamic else 3) * variants if trainer_compile else 1
    return max(blocks, recompile_limit or 0)


def expected_compiles(cfg: Any, model: Any, recompile_limit: Optional[int], device_type: str) -> Optional[int]:
    """`expected_compiles_per_frame` for the TrainConfig `cfg` and the built `model`'s blocks; under
    layered attention, rows up to `data.max_seq_len` past one attention pass add a graph per pass count
    (align.models.layered_attention.pass_variants)."""
    config = getattr(model.config, "text_config", model.config)
    variants = block_variants(config)
    if cfg.trainer.compile:
        from align.models import layered_attention

        if getattr(config, "_attn_implementation", None) == layered_attention.NAME:
            variants += layered_attention.pass_variants(config, cfg.data.max_seq_len, device_type)
    return expected_compiles_per_frame(cfg.trainer.compile, cfg.trainer.compile_dynamic, recompile_limit, variants)


def compile_choice(cfg: Any, model: Any, recompile_limit: Optional[int], device_type: str) -> dict[str, Any]:
    """The graphs one frame is expected to compile, and dynamo's per-frame recompile limit raised to
    that count where it is lower: past the limit dynamo runs the frame eager for good, so a configuration
    whose expected graphs exceed it (Gemma-4's blocks with rows past four attention passes) would lose
    its compiled blocks by design. Returns {expected_compiles_per_frame, recompile_limit}; the limit is
    the one in force (None when nothing compiles)."""
    expected = expected_compiles(cfg, model, recompile_limit, device_type)
    if not cfg.trainer.compile:
        return {"expected_compiles_per_frame": expected, "recompile_limit": recompile_limit}
    import torch._dynamo.config

    config = torch._dynamo.config
    if expected is not None and expected > config.recompile_limit:
        config.recompile_limit = expected
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, expected)
    return {"expected_compiles_per_frame": expected, "recompile_limit": int(config.recompile_limit)}


def frames_over(expected: Optional[int]) -> list[int]:
    """Compile counts of the frames that compiled more than `expected` graphs (dynamo's per-frame counter)."""
    if expected is None or "torch._dynamo" not in sys.modules:
        return []
    try:
        from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER

        return sorted(int(n) for n in FRAME_COMPILE_COUNTER.values() if n > expected)
    except Exception:  # an internal that may move between torch releases
        return []
