"""The adapter-only export of a LoRA run, in PEFT's own format, and the base it applies to.

`export/adapter/` holds what `PeftModel.save_pretrained` writes (adapter_config.json with r, alpha,
dropout and the target modules; adapter_model.safetensors with the lora_A / lora_B tensors) and the
tokenizer. `PeftModel.from_pretrained(base, "export/adapter")` on the model the run started from
gives the trained function: `base_model` says what that is. A sharded model hands in the full state
dict its ranks gathered (align/parallel/sharded_export.py); peft picks the adapter's tensors out of it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import torch

from align.config import LoraConfig, TrainConfig

SAVE_KWARGS = {"safe_serialization": True, "is_main_process": True}
"""`PeftModel.save_pretrained`'s kwargs (a preflight kwargs site too: align/run/kwargs_sites.py)."""


def save_kwargs(state_dict: Optional[dict] = None) -> dict:
    """`SAVE_KWARGS`, and `state_dict` for a sharded model: save_pretrained reads it from its **kwargs
    (which is where `check_kwargs` finds it in the installed source) and filters the adapter out of it."""
    from peft import PeftModel

    from align.core.signatures import check_kwargs

    kw = dict(SAVE_KWARGS, **({} if state_dict is None else {"state_dict": state_dict}))
    check_kwargs(PeftModel.save_pretrained, kw, "model.lora.export")
    return kw


def save_adapter(model: torch.nn.Module, out: Path, state_dict: Optional[dict] = None) -> Path:
    """peft's adapter files for `model` (a PeftModel) in `out`; `state_dict`: the full tensors to read
    instead of the model's own (a sharded model's)."""
    model.save_pretrained(str(out), **save_kwargs(state_dict))
    return Path(out)


def base_model(cfg: TrainConfig, tokenizer) -> torch.nn.Module:
    """The model a run's adapter applies to, fp32 on the host. With `model.pretrained`: that
    checkpoint as transformers loads it. A random-init preset: the weights the run started from,
    built as the trainer builds them (`torch.manual_seed(trainer.seed)`, then the preset; the global
    generator is left as it was). `model.init_on_device` drew them from the CUDA generator: rebuild
    such a base on that device type."""
    from align.models.build import build_model
    from align.models.family import family_spec

    if cfg.model.pretrained:
        _, model_cls = family_spec(cfg.model).classes()  # under model=hf: the class its checkpoint picks
        return model_cls.from_pretrained(Path(cfg.model.pretrained), dtype=torch.float32, local_files_only=True)
    plain = dataclasses.replace(cfg.model, lora=LoraConfig())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.trainer.seed)
        return build_model(plain, cfg.attention, tokenizer, torch.device("cpu")).model.float()
