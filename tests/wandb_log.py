"""Read an offline W&B run back (tests only).

wandb >= 0.2x dropped its Python reader of the `.wandb` transaction log; the format is the LevelDB
log format (32 KiB blocks of records: crc32 u32, length u16, type u8 in FULL/FIRST/MIDDLE/LAST)
after a 7-byte header (":W&B", magic 0xBEE1, version), each record a `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Iterator

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(path: Path) -> Iterator[bytes]:
    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"not a W&B transaction log: {path}"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(raw):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:
            pos += left_in_block  # trailer padding
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + HEADER])
        data = raw[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind == FULL:
            yield data
        elif kind == FIRST:
            pending = data
        elif kind == MIDDLE:
            pending += data
        elif kind == LAST:
            yield pending + data
            pending = b""


def _records(log_file: Path, wait_s: float) -> list:
    """The log's records once it holds the run's exit record: wandb's service writes the log in a process
    of its own, and `wandb.finish()` can return before the last records reach the file. After `wait_s`
    the records as they are."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + wait_s
    while True:
        records = []
        for payload in _payloads(log_file):
            rec = pb.Record()
            rec.ParseFromString(payload)
            records.append(rec)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def read_run(run_dir: Path, wait_s: float = 30.0) -> dict:
    """{'run': {...}, 'config': {...}, 'history': [rows], 'summary': {...}, 'metrics': [...],
    'artifacts': [{name, type, aliases, metadata, paths}]} of an offline run dir."""
    (log_file,) = list(Path(run_dir).glob("run-*.wandb"))
    out: dict = {"run": {}, "config": {}, "history": [], "summary": {}, "metrics": [], "artifacts": []}
    for rec in _records(log_file, wait_s):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = {"id": rec.run.run_id, "name": rec.run.display_name, "group": rec.run.run_group,
                          "project": rec.run.project, "resume": rec.run.resume}
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in rec.summary.update})
        elif kind == "artifact":
            a = rec.artifact
            out["artifacts"].append({"name": a.name, "type": a.type, "aliases": list(a.aliases),
                                     "metadata": json.loads(a.metadata) if a.metadata else {},
                                     "paths": sorted(e.path for e in a.manifest.contents)})
        elif kind == "metric":
            out["metrics"].append({"name": rec.metric.name, "glob": rec.metric.glob_name,
                                   "step_metric": rec.metric.step_metric})
    return out
