"""history.jsonl: one JSON row per optimizer step, appended and flushed as it happens."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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


def read_history(path: Path) -> list[dict[str, Any]]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
