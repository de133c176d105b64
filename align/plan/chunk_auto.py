"""`trainer.loss_chunk_tokens=auto` resolved where the device is known: whether the LM head and loss run
chunk by chunk (align/objectives/ce.py's ChunkedCE) or over all logits at once.

On a CPU: 0 (all logits at once), so the tests and the embedded default keep the one-call loss. On CUDA:
`CHUNK` where the full logits of a token, with the loss's fp32 copies, would weigh at least
`RATIO` x what the decoder layers keep for that token; else 0. Chunking then frees a third or more of
the working set for a larger token budget (`sampler.max_tokens=auto` is resolved after this, against
the estimate with the chunk). Below that ratio the logits are a small share, and one call keeps the
head's GEMM whole. The ratios of the bench models are in docs/performance.md#fast-by-default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from align.config.rules import AUTO

CHUNK = 2048
"""The chunk auto picks: the one measured on Gemma-4 26B-A4B LoRA (docs/performance.md)."""
RATIO = 0.5
"""Full logits at or above this share of the layers' kept activations per token: chunk."""


def per_token_bytes(cfg: Any, device: torch.device) -> tuple[int, int]:
    """(full logits, kept layer activations) in bytes per token, as the memory estimate counts them."""
    from align.models.family import family_spec
    from align.plan.memory import compute_bytes, layer_activation_bytes, logits_bytes, meta_model

    model, config = meta_model(cfg.model)
    moe = family_spec(cfg.model).moe_shape(config)
    nbytes = compute_bytes(cfg, device)
    logits = logits_bytes(0, 1, config.vocab_size, getattr(config, "final_logit_softcapping", None), nbytes)
    return logits, layer_activation_bytes(cfg, model, config, moe, 1, nbytes)


def resolve_loss_chunk(cfg: Any, device: torch.device) -> tuple[int, str]:
    """The chunk `auto` stands for on `device`, and why."""
    if device.type != "cuda":
        return 0, (f"trainer.loss_chunk_tokens=auto on {device.type}: 0 (all logits at once; no accelerator "
                   "memory to bound)")
    logits, acts = per_token_bytes(cfg, device)
    ratio = logits / max(acts, 1)
    if ratio >= RATIO:
        return CHUNK, (f"trainer.loss_chunk_tokens=auto on {device}: {CHUNK}, the full logits of a token "
                       f"({logits} B) weigh {ratio:.2f} x the layers' kept activations ({acts} B), at least {RATIO}")
    return 0, (f"trainer.loss_chunk_tokens=auto on {device}: 0, the full logits of a token ({logits} B) weigh "
               f"{ratio:.2f} x the layers' kept activations ({acts} B), below {RATIO}")


def plan_loss_chunk(cfg: Any, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """`cfg` with `trainer.loss_chunk_tokens` an int, and the manifest's `loss_chunk` record (requested,
    resolved, why)."""
    chunk = cfg.trainer.loss_chunk_tokens
    if chunk != AUTO:
        return cfg, {"requested": chunk, "resolved": chunk, "why": "trainer.loss_chunk_tokens as given"}
    tokens, why = resolve_loss_chunk(cfg, device)
    resolved = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, loss_chunk_tokens=tokens))
    return resolved, {"requested": AUTO, "resolved": tokens, "why": why}
