"""The records an eval runs on: the bundled GSM8K test split or a local JSONL of prompts.

Reading is cheap and strict (no tokenizer): preflight reads the same records the run will, so a
missing field or an unreadable reference is one line naming file:line and exit 2 before any model
load. The content hash is of the whole file; `limit` goes into the cache key beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from align.core.hashing import sha256_file
from align.data.sources import bundled_gsm8k
from align.errors import ConfigError
from align.evaluation.config import EvalConfig, EvalTask
from align.rewards import BadReference, Verifier


@dataclass(frozen=True)
class Item:
    """One prompt of the eval."""

    index: int
    id: str
    """`<file stem>:<line>` or `<file stem>:<id_field value>`."""
    prompt: str
    reference: Optional[str]
    """The reference answer (task gsm8k); None for tasks without one."""


@dataclass(frozen=True)
class EvalData:
    path: Path
    sha256: str
    bundled: bool
    items: list[Item]
    limit: Optional[int]

    def meaning(self, cfg: EvalConfig) -> dict[str, Any]:
        """What of the data gives an eval's results their meaning: content, not path."""
        fields = {"prompt_field": cfg.prompt_field, "id_field": cfg.id_field}
        if cfg.task == EvalTask.gsm8k:
            fields["reference_field"] = cfg.reference_field
        return {"sha256": self.sha256, "limit": self.limit, "records": len(self.items), **fields}


def data_path(cfg: EvalConfig) -> tuple[Path, bool]:
    if cfg.prompts:
        return Path(cfg.prompts), False
    return bundled_gsm8k("test"), True


def _text(row: dict, field: str, where: str, key: str) -> str:
    if field not in row:
        raise ConfigError(where, f"record has no field '{field}' (set {key}); keys: {sorted(row)}")
    value = row[field]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"field '{field}' must be a non-empty string, got {type(value).__name__}")
    return value


def load_data(cfg: EvalConfig, verifier: Optional[Verifier] = None) -> EvalData:
    """The first `cfg.limit` records of the eval's file; with a verifier, every reference is checked
    to be readable by it (a data error, refused before generation)."""
    path, bundled = data_path(cfg)
    if not path.is_file():
        raise ConfigError("eval.prompts", f"no such file: {path}")
    items: list[Item] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if cfg.limit is not None and len(items) >= cfg.limit:
                break
            if not raw.strip():
                continue
            items.append(_item(raw, f"{path}:{lineno}", lineno, len(items), path.stem, cfg, verifier))
    if not items:
        raise ConfigError("eval.prompts", f"no records in {path}")
    return EvalData(path=path.resolve(), sha256=sha256_file(path), bundled=bundled, items=items, limit=cfg.limit)


def _item(raw: bytes, where: str, lineno: int, index: int, stem: str, cfg: EvalConfig,
          verifier: Optional[Verifier]) -> Item:
    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(where, f"malformed JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(row, dict):
        raise ConfigError(where, f"a record must be a JSON object, got {type(row).__name__}")
    prompt = _text(row, cfg.prompt_field, where, "eval.prompt_field")
    reference = None
    if cfg.task == EvalTask.gsm8k:
        reference = _text(row, cfg.reference_field, where, "eval.reference_field")
        if verifier is not None:
            try:
                verifier.normalize_reference(reference)
            except BadReference as e:
                raise ConfigError(where, f"the {verifier.name} verifier cannot read the reference: {e}") from None
    if cfg.id_field is not None:
        if cfg.id_field not in row:
            raise ConfigError(where, f"record has no id field '{cfg.id_field}' (eval.id_field)")
        rid = f"{stem}:{row[cfg.id_field]}"
    else:
        rid = f"{stem}:{lineno}"
    return Item(index=index, id=rid, prompt=prompt, reference=reference)
