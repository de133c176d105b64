"""Record sources: bundled GSM8K, local files (align/data/files.py), or a weighted mixture of them.

Each source's records are read in its format (align/data/formats.py: named by `data.format` or
detected), and become a chat, a text or pre-tokenized ids (`data.source=tokens`).

Every record keeps its root: the source it came from, optionally split further by a record field
(`data.root_field`). Diversity is measured in roots (roots per accumulation window, docs/triage.md#4).
GSM8K has no source field, so the bundled source derives `steps` (the number of reasoning lines of
the reference answer) for conf/data/gsm8k.yaml to use as its root field: it correlates with length
the way real sources do, which is exactly what makes length bucketing a diversity hazard.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Optional

from align.config import DataConfig, DataFormat, OnBadRecord, Source
from align.data import files, formats
from align.data.files import BadRecord, content_sha256, sha256_file  # noqa: F401 (the names callers import)
from align.errors import ConfigError

log = logging.getLogger("align")


@dataclass(frozen=True)
class Record:
    id: str
    """Stable id: `<source>:<line number>` (or `<source>:<id_field value>`)."""
    root: str
    """Source id of the record: `<source>` or `<source>/<root_field>=<value>`."""
    messages: list[dict[str, str]]
    """The chat: [{role, content}, ...]; assistant turns are trained on."""
    source: int = 0
    """Index of the record's source in `source_specs(cfg)`."""
    tokens: Optional[tuple[int, ...]] = None
    """Pre-tokenized rows (`data.source=tokens`): the ids, encoded as they are."""
    loss_mask: Optional[tuple[bool, ...]] = None
    """Targets of a pre-tokenized row; null: every token."""
    where: str = ""
    """`<file>:<line>` (or `<file>:<row>` for a file read through `datasets`), what an error names."""
    text: Optional[str] = None
    """A `text` record (data.format=text): every token is a target and there is no chat."""
    untrained: tuple[int, ...] = ()
    """Assistant turns that are context and get no loss (a prompt/completion record's prompt)."""
    columns: Optional[dict[str, Any]] = None
    """The record's fields as read (`load_records(columns=True)`: what a python reward gets); else None."""


@dataclass(frozen=True)
class SourceSpec:
    """One resolved source: the mixture entry (or the single `data.*` source) with inherited fields."""

    name: str
    kind: Source
    path: Path
    split: str
    weight: float
    messages_field: str
    prompt_field: str
    response_field: str
    root_field: Optional[str]
    id_field: Optional[str]
    tokens_field: str
    key: str
    """The config key to name in errors (`data` or `data.mixture.<name>`)."""
    format: DataFormat = DataFormat.auto
    """The record format named (`data.format`), or auto: detected from the records."""
    format_key: str = "data.format"
    """The key `format` comes from (`data.format`, or the mixture source's own)."""

    @property
    def file(self) -> str:
        """How the file is read (align.data.files.file_kind)."""
        return files.file_kind(self.path, self.kind.value)

    def meaning(self) -> dict[str, Any]:
        """What of this spec changes the encoding (the cache key adds the file's CONTENT hash).
        Not the path (a path is stable across an edit) and not the weight (a sampler matter); the
        file kind the path's name picks, as it numbers the records."""
        d = asdict(self)
        for k in ("path", "weight", "key", "format_key"):
            d.pop(k)
        d["kind"] = self.kind.value
        d["format"] = self.format.value
        d["file"] = self.file
        if bundled_path(self.kind, self.split) is None:
            d.pop("split")
        return d


def bundled_gsm8k(split: str) -> Path:
    return Path(str(resources.files("align.data") / "assets" / "gsm8k" / f"{split}.jsonl"))


def bundled_gsm8k_pairs() -> Path:
    """The bundled preference pairs (scripts/make_gsm8k_pairs.py writes them from GSM8K train)."""
    return Path(str(resources.files("align.data") / "assets" / "gsm8k_pairs" / "gsm8k_pairs.jsonl"))


def bundled_path(kind: Source, split: str) -> Optional[Path]:
    """The packaged file of a bundled source (gsm8k; add, mul: align/data/synthetic.py); None for a user file."""
    if kind == Source.gsm8k:
        return bundled_gsm8k(split)
    if kind == Source.gsm8k_pairs:
        return bundled_gsm8k_pairs()
    if kind in (Source.add, Source.mul):
        from align.data.synthetic import bundled_add, bundled_mul

        return (bundled_add if kind == Source.add else bundled_mul)(split)
    return None


def source_path(cfg: DataConfig) -> Path:
    """The single source's file (kept for callers that predate mixtures)."""
    return source_specs(cfg)[0].path


def source_specs(cfg: DataConfig) -> list[SourceSpec]:
    """The sources of `cfg` in order: the mixture entries, or the one source of `data.*`."""

    def spec(
        name: Optional[str], kind: Source, path: Optional[str], split: str, weight: float, key: str, over=None
    ) -> SourceSpec:
        bundled = bundled_path(kind, split)
        p = bundled if bundled is not None else Path(path or "")
        pick = lambda f: getattr(over, f) if over is not None and getattr(over, f) is not None else getattr(cfg, f)  # noqa: E731
        return SourceSpec(
            name=name or (kind.value if bundled is not None else p.stem),
            kind=kind,
            path=p,
            split=split,
            weight=weight,
            messages_field=pick("messages_field"),
            prompt_field=pick("prompt_field"),
            response_field=pick("response_field"),
            root_field=pick("root_field"),
            id_field=pick("id_field"),
            tokens_field=pick("tokens_field"),
            key=key,
            format=pick("format"),
            format_key=f"{key}.format" if over is not None and over.format is not None else "data.format",
        )

    if not cfg.mixture:
        return [spec(cfg.name, cfg.source, cfg.path, cfg.split, 1.0, "data")]
    return [spec(n, s.kind, s.path, s.split, s.weight, f"data.mixture.{n}", s) for n, s in cfg.mixture.items()]


def path_problem(spec: SourceSpec) -> Optional[str]:
    """Why the source's path is not something it can read, or None."""
    return files.path_problem(spec.path)


def _rows(spec: SourceSpec) -> Iterator[tuple[int, Any]]:
    """(line or row number, parsed row or BadRecord) for every record of the source's file."""
    return files.read_rows(spec.path, spec.file, spec.key)


def _gsm8k_fields(row: dict) -> dict:
    # Reasoning lines of the reference answer, without the final "#### <number>" line.
    if "steps" not in row and isinstance(row.get("answer"), str):
        row = {**row, "steps": sum(1 for ln in row["answer"].splitlines() if ln.strip() and not ln.startswith("####"))}
    return row


def _token_row(row: dict, spec: SourceSpec) -> tuple[tuple[int, ...], Optional[tuple[bool, ...]]]:
    # bool is an int in Python: isinstance would train `true` as id 1, and bool(2) makes any number a
    # target. Types are checked exactly.
    field = spec.tokens_field
    ids = row.get(field)
    accepted = f"accepted: a non-empty list of integer token ids >= 0 (data.tokens_field={field})"
    if not isinstance(ids, list) or not ids:
        raise BadRecord(f"field '{field}' is {_json_kind(ids)}; {accepted}")
    if not all(type(t) is int and t >= 0 for t in ids):
        i, t = next((i, t) for i, t in enumerate(ids) if type(t) is not int or t < 0)
        raise BadRecord(f"'{field}'[{i}] is {json.dumps(t)}; {accepted}")
    mask = row.get("loss_mask")
    if mask is None:
        return tuple(ids), None
    if not isinstance(mask, list) or len(mask) != len(ids):
        raise BadRecord(f"field 'loss_mask' is {_json_kind(mask)}; accepted: a list of 0/1 as long as '{field}' "
                        f"({len(ids)})")
    bad = next(((i, m) for i, m in enumerate(mask) if not (type(m) is bool or (type(m) is int and m in (0, 1)))),
               None)
    if bad is not None:
        raise BadRecord(f"'loss_mask'[{bad[0]}] is {json.dumps(bad[1])}; accepted: 0 or 1 (or false/true) per token")
    return tuple(ids), tuple(bool(m) for m in mask)


def _json_kind(value: Any) -> str:
    if value is None:
        return "missing or null"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"of type {type(value).__name__}"


def top_token(records: list[Record]) -> Optional[tuple[int, str]]:
    """The largest token id of the pre-tokenized records and the `file:line` of its first row; None
    without any. Preflight holds it against the model's vocabulary before the run dir exists."""
    top: Optional[tuple[int, str]] = None
    for r in records:
        if r.tokens is not None and (top is None or max(r.tokens) > top[0]):
            top = max(r.tokens), r.where
    return top


def _record(row: dict, lineno: int, spec: SourceSpec, index: int, fmt: Optional[DataFormat] = None,
            how: str = "", columns: bool = False) -> Record:
    tokens = mask = None
    chat = formats.Chat([])
    if spec.kind == Source.tokens:
        tokens, mask = _token_row(row, spec)
    else:
        if spec.kind == Source.gsm8k:
            row = _gsm8k_fields(row)
        chat = formats.to_chat(row, spec, fmt, how)
        if chat.text is None and not any(m["role"] == "assistant" for m in chat.messages):
            raise BadRecord("record has no assistant turn to train on")
    if spec.id_field is not None:
        if spec.id_field not in row:
            raise BadRecord(f"record has no id field '{spec.id_field}' (data.id_field)")
        rid = f"{spec.name}:{row[spec.id_field]}"
    else:
        rid = f"{spec.name}:{lineno}"
    root = spec.name
    if spec.root_field is not None:
        if spec.root_field not in row:
            raise BadRecord(f"record has no root field '{spec.root_field}' (data.root_field)")
        root = f"{spec.name}/{spec.root_field}={row[spec.root_field]}"
    return Record(id=rid, root=root, messages=chat.messages, source=index, tokens=tokens, loss_mask=mask,
                  where=f"{spec.path}:{lineno}", text=chat.text, untrained=chat.untrained,
                  columns=dict(row) if columns else None)


def source_format(spec: SourceSpec, fmt: Optional[DataFormat], how: str) -> dict[str, Any]:
    """What the manifest records of a source's format: the format, how it was chosen, the file kind."""
    return {"format": fmt.value if fmt is not None else None, "chosen_by": how, "file": spec.file}


def load_records(cfg: DataConfig, report: Optional[dict] = None, columns: bool = False) -> list[Record]:
    """Every record of every source, in order, in the source's format. Bad records fail or are skipped
    per `data.on_bad_record`; skips are counted in `report` (skipped_bad, skipped_where), and each
    source's format goes into `report["formats"]` ({source name: source_format}). `columns`: each
    record keeps its fields as read (what a python reward gets)."""
    report = {} if report is None else report
    skipped: list[str] = []
    records: list[Record] = []
    seen: set[str] = set()
    chosen: dict[str, Any] = {}
    for index, spec in enumerate(source_specs(cfg)):
        n = 0
        rows = list(_rows(spec))  # the whole source: its format is detected from every record
        fmt, how = (None, "pre-tokenized rows") if spec.kind == Source.tokens else formats.resolve(rows, spec, False)
        chosen[spec.name] = source_format(spec, fmt, how)
        for lineno, row in rows:
            where = f"{spec.path}:{lineno}"
            try:
                if isinstance(row, BadRecord):
                    raise row
                rec = _record(row, lineno, spec, index, fmt, how, columns)
                if rec.id in seen:
                    raise BadRecord(f"duplicate record id {rec.id!r}")
            except BadRecord as e:
                if cfg.on_bad_record == OnBadRecord.fail:
                    raise ConfigError(where, f"{e} (set data.on_bad_record=skip to skip such records)") from None
                skipped.append(f"{where}: {e}")
                continue
            seen.add(rec.id)
            records.append(rec)
            n += 1
            if cfg.max_records is not None and n >= cfg.max_records:
                break
        if n == 0:
            raise ConfigError(
                f"{spec.key}",
                f"no usable records in {spec.path}" + (f" ({len(skipped)} skipped as bad)" if skipped else ""),
            )
    if skipped:
        log.warning("data: skipped %d bad record(s), first: %s", len(skipped), skipped[0])
    report.update(skipped_bad=len(skipped), skipped_where=skipped[:100], formats=chosen)
    return records
