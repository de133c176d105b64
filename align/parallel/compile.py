"""torch.compile per decoder block (torchtitan's granularity): each block compiles once and is
reused by every layer of its class; the loss, the optimizer and the data path stay eager.

torch is imported inside the functions: `compile_kwargs` is also preflight's kwargs builder, which
runs before any heavy import (align.run.kwargs_sites)."""

from __future__ import annotations

from typing import Any, Optional

COMPILE = "torch:compile"
"""The callable `nn.Module.compile` hands its kwargs to: the name preflight checks them against."""


def compile_kwargs(dynamic: Optional[bool]) -> dict[str, Any]:
    return {"dynamic": dynamic}


def compile_blocks(model, dynamic: Optional[bool], backend: str = "inductor") -> dict[str, Any]:
    """Compile every decoder block in place, before sharding (fully_shard wraps the compiled block).
    `dynamic`: trainer.compile_dynamic (its default lives in the config only). `backend`: the CPU
    tests use "eager" (dynamo's guards and recompiles, no code generation)."""
    from align.parallel.fsdp import decoder_blocks

    blocks = decoder_blocks(model)
    kwargs = compile_kwargs(dynamic)
    for block in blocks:
        block.compile(backend=backend, **kwargs)
    return {"blocks": len(blocks), "block_class": type(blocks[0]).__name__, "granularity": "decoder block", **kwargs}
