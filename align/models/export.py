"""Export in the HF layout (safetensors + config + tokenizer), loadable by `from_pretrained`.

LoRA runs export MERGED weights: serving engines often cannot hot-swap adapters onto MoE models
(docs/pitfalls.md#21), and a merged checkpoint is what `from_pretrained` loads with no peft at all. A QLoRA
adapter is merged into the base re-read at full precision from `model.pretrained`, never into the
4-bit weights (that would bake quantization error into the export).

Written to `<dir>.tmp` and renamed, so an `export/` that exists is complete. Merging is in place:
export is the last thing a run does with its model.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch

from align.run.quiet import library_progress_bars

log = logging.getLogger("align")


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def _is_quantized(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False)
                or getattr(getattr(model, "base_model", None), "is_loaded_in_4bit", False)
                or any(type(m).__name__ == "Linear4bit" for m in model.modules()))


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """The plain transformers model to save: LoRA merged into the base weights."""
    if not is_peft(model):
        return model
    if not _is_quantized(model):
        return model.merge_and_unload()
    return _merge_onto_full_precision_base(model)


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


def export_hf(model: torch.nn.Module, tokenizer, out: Path, state_dict: dict | None = None) -> Path:
    """`state_dict`: full (unsharded) tensors to write instead of the model's own, for a sharded model."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with library_progress_bars():
        merged(model).save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
