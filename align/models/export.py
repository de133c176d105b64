"""Export in the HF layout (safetensors + config + tokenizer), loadable by `from_pretrained`.

Written to `<dir>.tmp` and renamed, so an `export/` that exists is complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def export_hf(model: torch.nn.Module, tokenizer, out: Path) -> Path:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
