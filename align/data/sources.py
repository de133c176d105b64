"""Record sources. Every record keeps its root (the source it came from): diversity is measured in roots."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from align.config import DataConfig, Source
from align.errors import ConfigError


@dataclass(frozen=True)
class Record:
    id: str
    """Stable id: `<source>:<line number>`."""
    root: str
    """Source id of the record."""
    messages: list[dict[str, str]]
    """The chat: [{role, content}, ...]; assistant turns are trained on."""


def bundled_gsm8k(split: str) -> Path:
    return Path(str(resources.files("align.data") / "assets" / "gsm8k" / f"{split}.jsonl"))


def source_path(cfg: DataConfig) -> Path:
    return bundled_gsm8k(cfg.split) if cfg.source == Source.gsm8k else Path(cfg.path or "")


def to_messages(row: dict, cfg: DataConfig, where: str) -> list[dict[str, str]]:
    if cfg.messages_field in row:
        msgs = row[cfg.messages_field]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
            raise ConfigError(where, f"field '{cfg.messages_field}' must be a list of {{role, content}}")
        return [{"role": m["role"], "content": m["content"]} for m in msgs]
    if cfg.prompt_field in row and cfg.response_field in row:
        return [
            {"role": "user", "content": str(row[cfg.prompt_field])},
            {"role": "assistant", "content": str(row[cfg.response_field])},
        ]
    raise ConfigError(
        where,
        f"record has neither '{cfg.messages_field}' nor '{cfg.prompt_field}'+'{cfg.response_field}' "
        f"(set data.messages_field / data.prompt_field / data.response_field); keys: {sorted(row)}",
    )


def load_records(cfg: DataConfig) -> list[Record]:
    path = source_path(cfg)
    root = "gsm8k" if cfg.source == Source.gsm8k else path.stem
    records: list[Record] = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(where, f"malformed JSON ({e.msg})") from None
            records.append(Record(id=f"{root}:{lineno}", root=root, messages=to_messages(row, cfg, where)))
            if cfg.max_records is not None and len(records) >= cfg.max_records:
                break
    if not records:
        raise ConfigError(str(path), "no records")
    return records
