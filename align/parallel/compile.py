"""torch.compile per decoder block (torchtitan's granularity): each block compiles once and is
reused by every layer of its class; the loss, the optimizer and the data path stay eager."""

from __future__ import annotations

from typing import Any

import torch

from align.parallel.fsdp import decoder_blocks


def compile_blocks(model: torch.nn.Module) -> dict[str, Any]:
    """Compile every decoder block in place, before sharding (fully_shard wraps the compiled block)."""
    blocks = decoder_blocks(model)
    for block in blocks:
        block.compile()
    return {"blocks": len(blocks), "block_class": type(blocks[0]).__name__, "granularity": "decoder block"}
