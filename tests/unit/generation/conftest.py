"""Helpers that recompute what the engine reports with plain forwards: the references the engine's outputs
are held against (the tiny random-init models themselves: tests/conftest.py `tiny_model`)."""

from __future__ import annotations

import contextlib

import torch


def prompts(n: int = 4, lo: int = 3, hi: int = 12, vocab: int = 4096, seed: int = 0) -> list[list[int]]:
    """Prompts of different lengths (so a batch of them is left-padded)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(lo, hi, n).round().long().tolist()
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was)


def argmax_loop(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding written out: a full forward over the whole sequence per token, no cache."""
    ids, device = list(prompt), next(model.parameters()).device
    with evaluating(model):
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def teacher_forced_logits(model: torch.nn.Module, prompt: list[int], completion: tuple[int, ...]) -> torch.Tensor:
    """(len(completion), vocab) fp32 logits that predicted each completion token, from one forward."""
    full = torch.tensor([list(prompt) + list(completion)], device=next(model.parameters()).device)
    with evaluating(model):
        logits = model(input_ids=full, use_cache=False).logits[0].float()
    return logits[len(prompt) - 1:-1]
