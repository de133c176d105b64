"""The router flip rate of MoE families: per MoE layer, the share of completion tokens whose top-k
expert SET differs between the rollout's forward (generation: a prefill, then one decode step per
token, with a KV cache) and the training forward over the same tokens. Numerics that differ between
the two paths (kernels, batch shapes, a generation copy in another dtype) flip near-tied experts; a
flipped token ran a different function than the one its log-prob claims.

`RouterRecorder` hooks each router's top-k output (align/models/family_table.py's `RouterTap`) while a
`with recorder.record():` block runs. Routers see their tokens flattened, [batch x length, k].

For generation the recorded calls are mapped back to completions with the transformers engine's
documented batching (docs/generation.md): rows (prompt, sample) in order, sorted by prompt length,
longest first and stable, cut into `batch_size` rows; each batch is one prefill call (its left-padded
width > 1) whose last position predicts token 0, then decode calls of one position per row, call j
predicting token j. Under lockstep decoding a finished rank's extra decode calls come after its batch's
and are never read.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence

import torch


class RouterRecorder:
    def __init__(self, model: torch.nn.Module, taps: Sequence[Any]) -> None:
        self.model, self.taps = model, list(taps)
        self.layers = [t.layer for t in self.taps]
        self.calls: dict[int, list[torch.Tensor]] = {}
        self.widths: list[int] = []

    @contextlib.contextmanager
    def record(self) -> Iterator["RouterRecorder"]:
        self.calls = {layer: [] for layer in self.layers}
        self.widths = []
        handles = [self.model.register_forward_pre_hook(self._call, with_kwargs=True)]
        handles += [t.index_module.register_forward_hook(self._hook(t)) for t in self.taps]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _call(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.widths.append(int(ids.shape[-1]) if ids is not None else -1)

    def _hook(self, tap):
        @torch.compiler.disable
        def hook(module, args, output):
            ids = tap.index_of(output).detach()
            self.calls[tap.layer].append(ids.reshape(-1, ids.shape[-1]))
        return hook


def generation_topk(rec: RouterRecorder, prompt_lens: Sequence[int], n: int, batch_size: int,
                    completion_lens: Sequence[int]) -> Optional[list[torch.Tensor]]:
    """Per layer [sum of completion lengths, k] top-k ids, rows in (prompt, sample) order, tokens in order;
    None when the recorded calls do not have the engine's batch structure."""
    rows = [(p, s) for p in range(len(prompt_lens)) for s in range(n)]
    order = sorted(range(len(rows)), key=lambda r: -prompt_lens[rows[r][0]])
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    starts = [i for i, w in enumerate(rec.widths) if w > 1]  # prefill calls
    if len(starts) != len(chunks) or not starts or starts[0] != 0:
        return None
    bounds = starts[1:] + [len(rec.widths)]
    out = []
    for layer in rec.layers:
        calls = rec.calls[layer]
        if len(calls) != len(rec.widths):
            return None
        per_row: dict[int, torch.Tensor] = {}
        for chunk, a, b in zip(chunks, starts, bounds):
            width = rec.widths[a]
            for q, r in enumerate(chunk):
                need = completion_lens[r]
                if b - a < need:
                    return None
                picks = [calls[a][q * width + width - 1]] + [calls[a + j][q] for j in range(1, need)]
                per_row[r] = torch.stack(picks)
        out.append(torch.cat([per_row[r] for r in range(len(rows))]))
    return out


def flips(generated: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """[tokens] bool: the two top-k id sets differ (order within a set does not matter)."""
    a = torch.sort(generated.to(trained.device).long(), dim=-1).values
    b = torch.sort(trained.long(), dim=-1).values
    return (a != b).any(dim=-1)
