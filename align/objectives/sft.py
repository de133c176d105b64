"""Supervised fine-tuning: cross-entropy over the loss-masked tokens, summed per micro-batch and
divided by the loss tokens of the whole window on all ranks (align/loss.py holds the two ways to
the same sum: all logits at once, or the head and CE in chunks)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from align.data.collate import Batch
from align.loss import ChunkedCE, ce_sum


class SFT:
    name = "sft"

    def __init__(self, model: torch.nn.Module, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = ce_sum
        """The loss of one micro-batch from the forward's output; the probes wrap it to time it."""
        if chunk_tokens:
            head = model.get_output_embeddings()
            self.loss_fn = ChunkedCE(head, chunk_tokens, getattr(model.config, "final_logit_softcapping", None))
        self._info = {"kind": "chunked_ce" if chunk_tokens else "ce", "chunk_tokens": chunk_tokens or None,
                      "vocab_size": model.get_output_embeddings().weight.shape[0],
                      "final_logit_softcapping": getattr(model.config, "final_logit_softcapping", None)}

    def next_window(self, batches: Iterator[Batch], n: int, device: torch.device) -> list[Batch]:
        return [next(batches).to(device) for _ in range(n)]

    def weight(self, batch: Batch) -> int:
        return batch.loss_tokens

    def micro_loss(self, forward: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        out = forward(batch.model_inputs(), hidden_only=bool(self.chunk_tokens))
        return self.loss_fn(out, batch.labels)

    def window_metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "loss": dict(self._info)}
