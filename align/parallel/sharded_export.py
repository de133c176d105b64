"""Export a possibly sharded model in the HF layout: every rank takes part in gathering the full
state dict (a collective), rank 0 alone writes it (a LoRA model: its adapter picked out of that state
by peft, and the merge done in a host copy built from it: align/models/export.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from align.config import LoraExport
from align.models.export import export_hf
from align.parallel.env import DistEnv


def export_model(model: torch.nn.Module, tokenizer, out: Path, env: DistEnv,
                 what: LoraExport = LoraExport.both) -> None:
    """`what`: model.lora.export (read for a LoRA model only)."""
    if not any(isinstance(p, DTensor) for p in model.parameters()):
        if env.is_main:
            export_hf(model, tokenizer, out, what=what)
        env.barrier()
        return
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        # transformers would gather again (rank 0 alone: a hang) when it sees the EP distributed_config.
        dc = getattr(model.config, "distributed_config", None)
        model.config.distributed_config = None
        try:
            export_hf(model, tokenizer, out, state_dict=full, what=what)
        finally:
            model.config.distributed_config = dc
    env.barrier()
