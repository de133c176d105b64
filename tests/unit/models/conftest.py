"""Shared fixtures for the model-family tests: the bundled tokenizer and tiny builds (no downloads)."""

from __future__ import annotations

import pytest
import torch

from align.config import AttentionConfig, Family, LoraConfig, ModelConfig, MoEConfig

MOE_FAMILIES = [Family.olmoe, Family.gemma4_moe]


@pytest.fixture(scope="session")
def tokenizer():
    from align.data.tokenizer import load_tokenizer

    return load_tokenizer(ModelConfig())


def tiny(family: Family, **kw) -> ModelConfig:
    moe = kw.pop("moe", None) or MoEConfig()
    lora = kw.pop("lora", None) or LoraConfig()
    return ModelConfig(family=family, moe=moe, lora=lora, **kw)


@pytest.fixture
def build(tokenizer):
    from align.models import build_model

    def _build(family: Family, attention: AttentionConfig | None = None, seed: int = 0, **kw):
        torch.manual_seed(seed)
        return build_model(tiny(family, **kw), attention or AttentionConfig(), tokenizer, torch.device("cpu"))

    return _build


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
