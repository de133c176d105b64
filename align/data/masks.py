"""Auxiliary loss-mask files: named assistant turns that must get no loss.

Format: JSONL, one line per record, `{"id": "<record id>", "turns": [<message index>, ...]}`, message
indices 0-based in the record's chat. Every file is applied: the excluded turns of all files are
UNIONED and OR-merged with the prompt mask, so no file can un-mask what another masked (never
last-wins). A file that names an unknown id, or a turn that is not an assistant turn, is refused
with file:line: a silently misaligned mask is the failure this guards against (docs/triage.md#8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from align.data.sources import Record
from align.errors import ConfigError


def load_mask_files(paths: Sequence[str], records: Sequence[Record]) -> dict[str, set[int]]:
    """Record id -> message indices excluded from the loss, merged over every file."""
    by_id = {r.id: r for r in records}
    excluded: dict[str, set[int]] = {}
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError("data.mask_files", f"no such file: {path}")
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ConfigError(where, f"malformed JSON in mask file ({getattr(e, 'msg', e)})") from None
                turns = row.get("turns") if isinstance(row, dict) else None
                if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(turns, list) \
                        or not all(isinstance(t, int) and not isinstance(t, bool) for t in turns):
                    raise ConfigError(where,
                                      'a mask line must be {"id": "<record id>", "turns": [<message index>, ...]}')
                rec = by_id.get(row["id"])
                if rec is None:
                    example = next(iter(by_id), "?")
                    raise ConfigError(where, f"names unknown record id {row['id']!r}: not among the {len(by_id)} "
                                             f"records loaded (ids look like {example!r})")
                for t in turns:
                    if not 0 <= t < len(rec.messages) or rec.messages[t]["role"] != "assistant":
                        role = rec.messages[t]["role"] if 0 <= t < len(rec.messages) else "no such"
                        answers = [i for i, m in enumerate(rec.messages) if m['role'] == 'assistant']
                        raise ConfigError(where, f"turn {t} of {rec.id} is a {role!r} turn; only assistant turns "
                                                 f"(indices {answers}) carry loss")
                excluded.setdefault(rec.id, set()).update(turns)
    return excluded
