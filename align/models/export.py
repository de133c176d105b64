"""Export in the HF layout (safetensors + config + tokenizer), loadable by `from_pretrained`.

LoRA runs export MERGED weights (`model.lora.export` merged or both): serving engines often cannot
hot-swap adapters onto MoE models (docs/pitfalls.md#21), and a merged checkpoint is what
`from_pretrained` loads with no peft at all. A QLoRA adapter is merged into the base re-read at full
precision from `model.pretrained`, never into the 4-bit weights (that would bake quantization error
into the export). With adapter or both, peft's own adapter files go to `<dir>/adapter/`
(align/models/adapter.py), written before the merge, which removes the adapters.

Written to `<dir>.tmp` and renamed, so an `export/` that exists is complete. Merging is in place:
export is the last thing a run does with its model.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

from align.config import LoraExport
from align.core.quiet import library_progress_bars
from align.models.adapter import save_adapter
from align.models.lora import ADAPTER_DIR

log = logging.getLogger("align")


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def _is_quantized(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False)
                or getattr(getattr(model, "base_model", None), "is_loaded_in_4bit", False)
                or any(type(m).__name__ == "Linear4bit" for m in model.modules()))


def merged(model: torch.nn.Module, state_dict: Optional[dict] = None) -> torch.nn.Module:
    """The plain transformers model to save: LoRA merged into the base weights. `state_dict`: the
    full tensors of a sharded model, merged in a host copy built from them."""
    if not is_peft(model):
        return model
    if state_dict is not None:
        return _host_copy(model, state_dict).merge_and_unload()
    if not _is_quantized(model):
        return model.merge_and_unload()
    return _merge_onto_full_precision_base(model)


def _host_copy(model: torch.nn.Module, state_dict: dict) -> torch.nn.Module:
    """The PeftModel again, unsharded, holding `state_dict`'s tensors: merging the sharded one would
    be a collective that rank 0 alone enters (align/parallel/sharded_export.py writes on rank 0 only)."""
    import copy

    from peft import get_peft_model

    base = model.get_base_model()
    with torch.device("meta"):
        host = get_peft_model(type(base)._from_config(copy.deepcopy(base.config)),
                              copy.deepcopy(model.peft_config["default"]))
    host.load_state_dict(state_dict, strict=True, assign=True)
    return host


def _merge_onto_full_precision_base(model: torch.nn.Module) -> torch.nn.Module:
    import tempfile

    from peft import PeftModel

    base = model.get_base_model()
    src = getattr(base.config, "_name_or_path", None)
    if not src or not Path(src).is_dir():
        raise RuntimeError(f"QLoRA export needs the full-precision base checkpoint; {src!r} is not a local directory")
    dtype = getattr(base.config, "dtype", None)
    dtype = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16
    with tempfile.TemporaryDirectory() as adapter:
        model.save_pretrained(adapter)
        full = type(base).from_pretrained(src, local_files_only=True, dtype=dtype)
        log.info("QLoRA export: merging the adapter into %s re-read in %s", src, dtype)
        return PeftModel.from_pretrained(full, adapter).merge_and_unload()


def export_hf(model: torch.nn.Module, tokenizer, out: Path, state_dict: dict | None = None,
              what: LoraExport = LoraExport.both) -> Path:
    """`state_dict`: full (unsharded) tensors to write instead of the model's own, for a sharded model.
    `what` (model.lora.export) applies to a PeftModel; any other model is written whole."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    lora = is_peft(model)
    with library_progress_bars():
        if lora and what != LoraExport.merged:
            save_adapter(model, tmp / ADAPTER_DIR, state_dict)
            tokenizer.save_pretrained(tmp / ADAPTER_DIR)
        if not lora or what != LoraExport.adapter:
            plain = state_dict is None or lora  # a LoRA host copy already holds the gathered tensors
            merged(model, state_dict).save_pretrained(tmp, **({} if plain else {"state_dict": state_dict}))
            tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
