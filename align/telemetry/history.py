"""history.jsonl: one JSON row per optimizer step, appended and flushed as it happens.

A kill during an append leaves the last line torn (no newline, not a whole JSON row). Every reader
goes through `history_lines`: a torn LAST line is skipped and reported; any other line that is not a
JSON row is corruption and refused with file:line (exit 2), never read past.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from align.errors import ConfigError


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)  # JSON has no NaN/inf; keep them visible as strings
    return v


class History:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a")

    def append(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _row(line: str) -> Optional[dict[str, Any]]:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def history_lines(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], Optional[int]]:
    """(text, row) of every row of a history file, and the number of a torn last line (skipped), or
    None. Raises ConfigError naming file:line for a line that is not a JSON row anywhere else: a
    newline-terminated last line was written whole, so it is corruption too."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # `tail` is what follows the last newline: "" when none is torn
    out: list[tuple[str, dict[str, Any]]] = []
    for i, line in enumerate(complete, 1):
        if not line.strip():
            continue
        row = _row(line)
        if row is None:
            raise ConfigError(f"{path}:{i}", "not a JSON row; only a torn last line (a kill during an append) "
                              "is skipped: this file is corrupt, move it aside or repair that line")
        out.append((line, row))
    if not tail.strip():
        return out, None
    row = _row(tail)
    if row is None:
        return out, len(complete) + 1
    out.append((tail, row))  # a whole row whose newline the kill cut off
    return out, None


def read_history(path: Path) -> list[dict[str, Any]]:
    return [row for _, row in history_lines(path)[0]]
