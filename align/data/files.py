"""Reading a source's file: JSON lines by our own reader, every other kind through the `datasets` library.

The kind of a file comes from its name: `.jsonl`/`.ndjson` (JSON lines), `.json` (JSON lines or one JSON
array), `.parquet`, `.arrow` (Arrow IPC, stream or file), or a directory written by `datasets`'
`save_to_disk` (a Dataset, or a DatasetDict of one split). A name without one of these suffixes is read
as its source kind says (`data.source=parquet`: Parquet, else JSON lines), as it always was.

JSON lines keep their own reader: each line is parsed alone, so a malformed line is a bad record named
`file:line` (refused, or skipped under data.on_bad_record=skip), and a value's type is the one written
(`datasets` fails the whole file on one bad line and unifies each field's type across the records).
A row of a columnar file holds every column: a null there means the record has no such field, so
nulls are left out of the row, as a JSON line would leave the key out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from align.core.hashing import sha256_file
from align.errors import ConfigError

JSONL, JSON, PARQUET, ARROW, DISK = "jsonl", "json", "parquet", "arrow", "save_to_disk"
SUFFIXES = {".jsonl": JSONL, ".ndjson": JSONL, ".json": JSON, ".parquet": PARQUET, ".arrow": ARROW}
ACCEPTED = ("a JSONL file (or .json, .parquet, .arrow), a `datasets` save_to_disk directory (state.json or "
            "dataset_dict.json in it), several files as a mixture (data.mixture.<name>.path, one file each)")


class BadRecord(Exception):
    pass


def saved_dataset(path: Path) -> bool:
    """A directory `datasets` wrote with save_to_disk (a Dataset or a DatasetDict)."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def file_kind(path: Path, source_kind: str) -> str:
    """How the file is read (module doc): its suffix, a save_to_disk directory, else the source's kind."""
    if path.is_dir():
        return DISK
    return SUFFIXES.get(path.suffix.lower(), PARQUET if source_kind == PARQUET else JSONL)


def path_problem(path: Path) -> Optional[str]:
    """Why the source's path is not something it can read, or None."""
    if path.is_file() or (path.is_dir() and saved_dataset(path)):
        return None
    if path.is_dir():
        return f"{path} is a directory; accepted: {ACCEPTED}"
    return f"no such file: {path}"


def content_sha256(path: Path) -> str:
    """sha256 of a file's content; of a directory, over every file's relative name and content hash."""
    path = Path(path)
    if not path.is_dir():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(p.relative_to(path).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def read_rows(path: Path, kind: str, key: str) -> Iterator[tuple[int, Any]]:
    """(line or row number, row or BadRecord) for every record; `key` is the config key errors name."""
    problem = path_problem(path)
    if problem:
        raise ConfigError(f"{key}.path", problem)
    if kind == JSONL:
        yield from _json_lines(path)
        return
    for i, row in enumerate(_dataset(path, kind, key), 1):
        yield i, {k: v for k, v in row.items() if v is not None}


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                yield lineno, BadRecord(f"malformed JSON ({getattr(e, 'msg', e)})")
                continue
            yield lineno, (row if isinstance(row, dict)
                           else BadRecord(f"a record must be a JSON object, got {type(row).__name__}"))


def _dataset(path: Path, kind: str, key: str):
    """The file as a `datasets.Dataset`, read into memory (the library's cache files go to a temporary
    directory, removed after: nothing is left in the user's cache, and no stale entry is ever read)."""
    import datasets
    from datasets.utils import logging as ds_logging

    what = {JSON: "JSON", PARQUET: "Parquet", ARROW: "Arrow", DISK: "save_to_disk"}[kind]
    bars, verbosity = ds_logging.is_progress_bar_enabled(), ds_logging.get_verbosity()
    # Progress bars and the library's own error log would add lines to a one-line refusal.
    ds_logging.disable_progress_bar()
    ds_logging.set_verbosity(logging.CRITICAL)
    try:
        if kind == DISK:
            ds = datasets.load_from_disk(str(path), keep_in_memory=True)
        else:
            with tempfile.TemporaryDirectory(prefix="align-datasets-") as cache:
                ds = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache,
                                           keep_in_memory=True)
    except Exception as e:  # the library raises many types for a file that is not what its name says
        cause = e.__cause__ or e
        detail = " ".join(f"{type(cause).__name__}: {cause}".split())
        raise ConfigError(f"{key}.path", f"not a readable {what} file: {path} ({detail[:300]})") from None
    finally:
        if bars:
            ds_logging.enable_progress_bar()
        ds_logging.set_verbosity(verbosity)
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise ConfigError(f"{key}.path", f"{path} is a DatasetDict of splits {sorted(ds)}; accepted: one split's "
                                             f"directory, e.g. {path / sorted(ds)[0]}")
        ds = next(iter(ds.values()))
    return ds
