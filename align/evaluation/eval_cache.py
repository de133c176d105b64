"""The eval cache: a finished arm's samples and metrics, keyed on everything that gives them meaning.

The key is sha256 of the canonical JSON of `key_parts`:

- `model`: the content hashes of the weight files and the model config, the tokenizer and its chat
  template (not the path: an export rewritten in place is a different model);
- `generation`: every `SamplingSpec` field (seed included) and the engine settings that shape the
  sampled stream or the numerics (backend, resolved mode, batch size, padding multiple, dtype, device
  type), and the number of prompts per engine call;
- `data`: the file's content hash, `limit`, the record count and the fields read;
- `scorer`: the verifier's identity (name, VERSION) or the refusal classifier's (VERSION, lists hash);
- `prompt`: the user-message template (the chat template is in `model`);
- `eval_version`: `EVAL_VERSION`, bumped when the runner's results can change for identical inputs.

A re-run of the same eval is a hit and generates nothing; any changed part is a miss. Entries are
written to a temporary file and renamed, so a reader sees a whole entry or none; an entry whose
stored parts differ from the asked ones (a corrupted or foreign file) is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

from align.core.hashing import canonical_json
from align.core.provenance import now

log = logging.getLogger("align")

EVAL_VERSION = 1
"""Bump when the runner's output for the same key parts can change (rendering, decoding, scoring)."""


def key_parts(*, model: Mapping[str, Any], generation: Mapping[str, Any], data: Mapping[str, Any],
              scorer: Mapping[str, Any], template: str) -> dict[str, Any]:
    """Every part of the key, by name (a part left out here is a part a changed run would not miss on)."""
    model_keys = ("weights_sha256", "config_sha256", "tokenizer_sha256", "chat_template_sha256")
    return {
        "eval_version": EVAL_VERSION,
        "model": {k: model[k] for k in model_keys},
        "generation": dict(generation),
        "data": dict(data),
        "scorer": dict(scorer),
        "prompt": {"template": template},
    }


def cache_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


class EvalCache:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, parts: Mapping[str, Any]) -> Optional[dict[str, Any]]:
        """The cached result for `parts`, or None."""
        key = cache_key(parts)
        try:
            entry = json.loads(self.path(key).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("eval cache: unreadable entry %s (%s): treated as a miss", self.path(key), e)
            return None
        if entry.get("key") != key or json.loads(canonical_json(parts)) != entry.get("parts"):
            log.warning("eval cache: entry %s does not hold the parts of its key: treated as a miss", self.path(key))
            return None
        return entry["result"]

    def put(self, parts: Mapping[str, Any], result: Mapping[str, Any]) -> Path:
        key = cache_key(parts)
        self.root.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "parts": json.loads(canonical_json(parts)), "created": now(), "result": result}
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, default=str)
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path(key)
