"""Whether a local HF checkpoint dir can load, read from its files alone, before any weight is: the
checks preflight runs on `model.pretrained` (align/run/preflight_checks.py) and `python -m align.eval`
on the model dirs it is given (align/evaluation/model_source.py). No torch at import time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def checkpoint_problem(d: Path) -> Optional[str]:
    """Why the HF checkpoint dir `d` cannot load, from its files alone (milliseconds: config.json is
    parsed, each safetensors header is read and its tensor offsets are held against the file size; a
    torch pickle's list of globals is read for what the weights-only loader would refuse); None when
    nothing is seen. A truncated shard otherwise fails inside from_pretrained, after the tokenizer, the
    encode and the rest of the weights."""
    if not (d.is_dir() and (d / "config.json").is_file()):
        return f"not a readable HF checkpoint dir (needs config.json): {d}"
    problem = _json_problem(d / "config.json")
    if problem:
        return problem
    index = d / "model.safetensors.index.json"
    if index.is_file():
        problem = _json_problem(index)
        if problem:
            return problem
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            return f"{index} has no weight_map"
        shards: dict[str, set[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, set()).add(name)
        for shard, names in sorted(shards.items()):
            problem, held = safetensors_problem(d / shard)
            if problem:
                return problem
            if not names <= held:
                missing = names - held
                return f"{d / shard} lacks {len(missing)} tensor(s) {index.name} places there, e.g. {min(missing)}"
        return None
    if (d / "model.safetensors").is_file():
        return safetensors_problem(d / "model.safetensors")[0]
    if any(d.glob("pytorch_model*.bin")):
        from align.models.checkpoint_fit import pickle_problem  # imports torch: only a torch pickle pays for it

        return pickle_problem(d)
    return f"no weights in {d} (looked for model.safetensors, model.safetensors.index.json, pytorch_model*.bin)"


def _json_problem(path: Path) -> Optional[str]:
    try:
        value = json.loads(path.read_text())
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    except UnicodeDecodeError:
        return f"{path} is not text (not a JSON file)"
    except ValueError as e:
        return f"{path} is not valid JSON: {e}"
    return None if isinstance(value, dict) else f"{path} holds a JSON {type(value).__name__}, not an object"


def safetensors_problem(path: Path) -> tuple[Optional[str], set[str]]:
    """(why `path` is not a whole safetensors file or None, the tensor names its header holds). The
    format: an 8-byte little-endian header length, a JSON header giving each tensor's byte range in
    the data that follows, and that data, which must end where the last range ends."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or n > size - 8:
                return f"{path} is truncated or not a safetensors file: {size} bytes, header claims {n}", set()
            header = json.loads(f.read(n))
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}", set()
    except ValueError as e:
        return f"{path}: its safetensors header is not valid JSON ({e})", set()
    try:
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return f"{path}: its safetensors header has no valid data_offsets", set()
    if 8 + n + end != size:
        how = "truncated" if 8 + n + end > size else "longer than its header says"
        return f"{path} is {how}: {size} bytes, its header places tensor data up to byte {8 + n + end}", set(tensors)
    return None, set(tensors)
