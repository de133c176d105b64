"""Helpers for the model-family tests (the tokenizer and the tiny builds: tests/conftest.py `tokenizer`, `build`)."""

from __future__ import annotations

import torch

from align.config import Family

MOE_FAMILIES = [Family.olmoe, Family.gemma4_moe]


def perturb_(model: torch.nn.Module, seed: int = 1, scale: float = 0.2) -> torch.nn.Module:
    """Give norms, routers and scalars non-default values so that a test can see where they are
    used (a freshly initialised norm is all ones: swapping two of them changes nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or "router" in name or ".gate." in name + ".":
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def batch(vocab: int, b: int = 2, s: int = 16, seed: int = 0, pad_last: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, s), generator=g)
    mask = None
    if pad_last:
        mask = torch.ones(b, s, dtype=torch.long)
        mask[-1, s - pad_last:] = 0
    return ids, mask
