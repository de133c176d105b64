"""Supervised fine-tuning: cross-entropy over the loss-masked tokens, summed per micro-batch and
divided by the loss tokens of the whole window on all ranks (align/objectives/ce.py holds the two ways to
the same sum: all logits at once, or the head and CE in chunks)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

from align.config import TrainConfig
from align.config.rules import require_auto_resolved
from align.data.collate import Batch
from align.data.encode import EncodedDataset
from align.data.encode_cache import load_dataset, save_dataset
from align.data.loader import BatchStream, build_stream
from align.objectives import register
from align.objectives.ce import ChunkedCE, ce_sum
from align.objectives.plan_terms import PlanTerms
from align.objectives.views import chat_view
from align.parallel.env import DistEnv, autocast_dtype


class SFTTerms(PlanTerms):
    """SFT: chat rows through the sampler, nothing beside the policy."""


@register
class SFT:
    name = "sft"
    terms = SFTTerms
    console_metrics = (("loss", "loss"),)
    view = staticmethod(chat_view)

    def __init__(self, cfg: TrainConfig) -> None:
        self.chunk_tokens = cfg.trainer.loss_chunk_tokens
        require_auto_resolved("trainer.compile_loss", cfg.trainer.compile_loss, "the objective",
                              "align.plan.compile_auto.resolve_compile")
        self.compiled = bool(cfg.trainer.compile_loss)
        self.precision = cfg.trainer.precision
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = ce_sum
        """The loss of one micro-batch from the forward's output; the probes wrap it to time it."""
        self._info: dict[str, Any] = {}

    def build_data(self, cfg: TrainConfig, tokenizer: Any, env: DistEnv) -> tuple[EncodedDataset, BatchStream]:
        self.data_cfg = cfg.data
        data = self.data = load_dataset(cfg.data, cfg.model, tokenizer, save=False)  # cached once the build succeeds
        pin = env.device.type == "cuda"
        return data, build_stream(cfg, data, tokenizer.pad_token_id, env.rank, env.world, pin_memory=pin)

    def prepare(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return []

    def bind(self, model: torch.nn.Module, forward: Callable[..., torch.Tensor], resuming: bool = False) -> None:
        save_dataset(self.data_cfg, self.data)  # the model loaded: the encoding is worth keeping now
        head, softcap = model.get_output_embeddings(), getattr(model.config, "final_logit_softcapping", None)
        if self.chunk_tokens:
            gemm = autocast_dtype(self.precision, head.weight.device.type)
            self.loss_fn = ChunkedCE(head, self.chunk_tokens, softcap, compiled=self.compiled, gemm_dtype=gemm)
        self._info = {"kind": "chunked_ce" if self.chunk_tokens else "ce", "chunk_tokens": self.chunk_tokens or None,
                      "compiled": bool(self.chunk_tokens) and self.compiled,
                      "vocab_size": head.weight.shape[0], "final_logit_softcapping": softcap}

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

    def rank_state_dict(self) -> dict[str, Any]:
        return {}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def gate(self, batch: Batch) -> Optional[dict[str, Any]]:
        return None  # SFT's batches are checked by the mask gate; it has no reference to compare

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "loss": dict(self._info),
                "gate": None, "gate_why_null": "sft has no reference; its batches are checked by the mask gate"}
