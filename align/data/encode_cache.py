"""The encode cache, keyed on MEANING (docs/triage.md#8).

`encode_cache_key` covers everything that can change what an encoding means: the CONTENT hash of
every source file and of every auxiliary mask file (never a path: a path is stable across an edit),
the tokenizer files' content, the chat template, max_seq_len, the truncation and bad-record
policies, the fields that pick prompt/response/roots/ids, each source's record format as configured
(`data.format`: a detected format is a function of the content, the configuration and the detection
rules, which `ENCODE_VERSION` covers) and the file kind, the tokenizer libraries' versions and
`ENCODE_VERSION`; for preference pairs also `PAIRING_VERSION`. Everything here is computed from
files, without loading the tokenizer, so preflight can compute the key in milliseconds
(`cache_key_parts(cfg.data, cfg.model)`).

An entry is `<cache_dir>/<key>/` holding .npy arrays and meta.json; it is written into a temporary
sibling and renamed into place, so a reader sees a whole entry or none, and a failed encode (bad
input) leaves nothing behind. The trainer saves it only once its whole build has succeeded
(`load_dataset(..., save=False)`, then `save_dataset`): a run refused at model load leaves no entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from align.config import DataConfig, ModelConfig
from align.core.caches import encode_location
from align.data.encode import EncodedDataset, dataset_fingerprint, encode_records
from align.data.masks import load_mask_files
from align.data.sources import content_sha256, load_records, path_problem, sha256_file, source_specs
from align.data.tokenizer import tokenizer_dir
from align.errors import ConfigError

log = logging.getLogger("align")

ENCODE_VERSION = 4
"""Bump whenever the encoder's output can change for identical inputs (masking rule, EOS handling,
array layout, record ids or roots, which records are bad: 3, a pre-tokenized row's bool id or mask value
other than 0/1; 4, record formats and their detection, align/data/formats.py). Cheap, blunt, and it
catches what no hash was thought of for."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "vocab.txt", "merges.txt")
"""Files a transformers tokenizer reads from its directory (plus additional_chat_templates/*)."""

PAIRING_VERSION = 3
"""Bump whenever the pair encoder's output can change for identical inputs: how a record becomes a
prompt and two completions (the implicit-prompt rule), the sequence layout (2i chosen, 2i+1 rejected),
which tokens carry loss (the completion and its closing EOS), truncation of a pair, which pairs are
dropped (2: a pair whose sides encode to the same tokens, e.g. once cut at max_seq_len; 3: each pair's
`margin`, align/data/margins.py, kept beside its sequences). Part of the key
of every preference encoding (align/data/preference.py) and of no chat encoding."""

_ARRAYS = ("tokens", "loss_mask", "offsets", "source_index")
_CONTENT = ("encode_cache_key", "encode_version", "fingerprint", "records_per_source", "formats", "tokenizer_sha256",
            "chat_template_sha256", "libraries")
"""The keys of `EncodedDataset.meta` an entry stores; the rest describe this run (paths, timings)."""


def encode_cache_key(*, sources: Sequence[dict[str, Any]], tokenizer_sha256: str, chat_template_sha256: str,
                     max_seq_len: int, truncation: str, on_bad_record: str, max_records: Optional[int],
                     aux_sha256s: Sequence[str] = (), libraries: Optional[dict[str, str]] = None,
                     encode_version: int = ENCODE_VERSION, pairing: Optional[dict[str, Any]] = None) -> str:
    """sha256 over the meaning of an encoding. `sources`: per source, in order, its `meaning()` plus
    `sha256` (file content). `aux_sha256s`: content hashes of the mask files; they are OR-merged, so
    their order does not matter and is not part of the key. `pairing`: how preference records become
    pairs of sequences (null for chat records, whose keys it leaves as they were)."""
    payload = {
        "encode_version": encode_version,
        "sources": list(sources),
        "tokenizer_sha256": tokenizer_sha256,
        "chat_template_sha256": chat_template_sha256,
        "max_seq_len": max_seq_len,
        "truncation": truncation,
        "on_bad_record": on_bad_record,
        "max_records": max_records,
        "aux_sha256s": sorted(aux_sha256s),
        "libraries": dict(sorted((libraries or {}).items())),
    }
    if pairing is not None:
        payload["pairing"] = pairing
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def tokenizer_sha256(directory: Path) -> str:
    """Content hash of the tokenizer files present in `directory` (names and bytes)."""
    directory = Path(directory)
    files = [directory / n for n in TOKENIZER_FILES if (directory / n).is_file()]
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        files += sorted(p for p in extra.iterdir() if p.is_file())
    if not files:
        raise ConfigError("model.pretrained",
                          f"no tokenizer files in {directory} (looked for {', '.join(TOKENIZER_FILES)})")
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(directory).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def chat_template_sha256(template: Any) -> str:
    """sha256 of a chat template as transformers holds it (a string, or a dict of named templates)."""
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def chat_template_from_files(directory: Path) -> Any:
    """The chat template transformers will load from `directory`: chat_template.jinja wins, then
    chat_template.json, then tokenizer_config.json's `chat_template`. Cross-checked against the
    loaded tokenizer in `load_dataset`."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text()
    if (directory / "chat_template.json").is_file():
        return json.loads((directory / "chat_template.json").read_text())["chat_template"]
    cfg = directory / "tokenizer_config.json"
    return json.loads(cfg.read_text()).get("chat_template") if cfg.is_file() else None


def _libraries() -> dict[str, str]:
    out = {}
    for name in ("transformers", "tokenizers", "jinja2"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def cache_key_parts(data_cfg: DataConfig, model_cfg: ModelConfig) -> dict[str, Any]:
    """Everything the key is computed from, plus the key: files only, no tokenizer load."""
    specs = source_specs(data_cfg)
    sources = []
    for s in specs:
        problem = path_problem(s)
        if problem:
            raise ConfigError(f"{s.key}.path", problem)
        sources.append({**s.meaning(), "sha256": content_sha256(s.path)})
    aux = []
    for p in data_cfg.mask_files:
        if not Path(p).is_file():
            raise ConfigError("data.mask_files", f"no such file: {p}")
        aux.append({"path": str(p), "sha256": sha256_file(Path(p))})
    tdir = tokenizer_dir(model_cfg)
    template = chat_template_from_files(tdir)
    parts: dict[str, Any] = {
        "sources": sources,
        "tokenizer_sha256": tokenizer_sha256(tdir),
        "chat_template_sha256": chat_template_sha256(template) if template is not None else None,
        "max_seq_len": data_cfg.max_seq_len,
        "truncation": data_cfg.truncation.value,
        "on_bad_record": data_cfg.on_bad_record.value,
        "max_records": data_cfg.max_records,
        "aux_sha256s": [a["sha256"] for a in aux],
        "libraries": _libraries(),
        "pairing": {"version": PAIRING_VERSION} if data_cfg.holds_pairs else None,
    }
    parts["key"] = encode_cache_key(**{k: v for k, v in parts.items()})
    parts["aux_files"] = aux
    parts["source_specs"] = specs
    return parts


def encode_cache_key_for(cfg) -> str:
    """The encode cache key of a TrainConfig, from files alone (preflight shows it before any load)."""
    return cache_key_parts(cfg.data, cfg.model)["key"]


# ----------------------------------------------------------------------------------- read / write


def _write_entry(entry: Path, data: EncodedDataset, content: dict[str, Any], extra_arrays: Sequence[str] = (),
                 extra_meta: Sequence[str] = ()) -> None:
    """Write into a temporary sibling, then rename: readers see a whole entry or none. `extra_*`: the
    names of further attributes of `data` to keep (arrays as .npy, the rest in meta.json)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        for name in (*_ARRAYS, *extra_arrays):
            np.save(tmp / f"{name}.npy", getattr(data, name))
        meta = {"ids": data.ids, "roots": data.roots, "stats": data.stats, "content": content,
                **{name: getattr(data, name) for name in extra_meta}}
        with (tmp / "meta.json").open("w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "meta.json").is_file():  # not "another process won the race": a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_raw(entry: Path, key: str, extra_arrays: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta.json, arrays) of an entry, refused unless it holds `key`."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        arrays = {name: np.load(entry / f"{name}.npy") for name in (*_ARRAYS, *extra_arrays)}
    except (OSError, ValueError) as e:
        raise ConfigError("data.cache_dir",
                          f"unreadable encode cache entry {entry} ({e}); delete it to re-encode") from None
    if meta["content"].get("encode_cache_key") != key:
        raise ConfigError("data.cache_dir",
                          f"encode cache entry {entry} holds key {meta['content'].get('encode_cache_key')}; delete it")
    return meta, arrays


def _read_entry(entry: Path, key: str) -> EncodedDataset:
    meta, arrays = _read_raw(entry, key)
    return EncodedDataset(ids=meta["ids"], roots=meta["roots"], stats=meta["stats"], meta=dict(meta["content"]),
                          **arrays)


def check_chat_template(tokenizer, model_cfg: ModelConfig, parts: dict[str, Any]) -> None:
    """The key covers the template read from the files; refuse a loaded tokenizer that holds another."""
    loaded = chat_template_sha256(tokenizer.chat_template) if tokenizer.chat_template is not None else None
    if loaded != parts["chat_template_sha256"]:
        raise ConfigError("model.pretrained", f"the loaded tokenizer's chat template (sha256 {loaded}) is not the "
                          f"one read from {tokenizer_dir(model_cfg)} ({parts['chat_template_sha256']}): the cache key "
                          "would not cover it")


def provenance(data: EncodedDataset, parts: dict[str, Any], entry: Path, cache: bool, hit: bool,
               seconds: float) -> None:
    """What the manifest records of where the encoding came from, into `data.meta` (parts: cache_key_parts)."""
    specs = parts["source_specs"]
    data.meta.update(
        cache_hit=bool(hit),
        cache_entry=str(entry) if cache else None,
        load_seconds=round(seconds, 3),
        # Paths and weights are this run's; the content hashes are what the key covered.
        sources=[{"name": s.name, "kind": s.kind.value, "path": str(s.path), "weight": s.weight,
                  "sha256": p["sha256"], "records": n}
                 for s, p, n in zip(specs, parts["sources"], data.meta["records_per_source"])],
        aux_files=parts["aux_files"],
        truncation={k: data.stats[k] for k in ("truncation_policy", "max_seq_len", "truncated", "dropped_too_long",
                                                "dropped_no_loss", "truncated_ids", "dropped_ids")},
        skipped_bad=data.stats.get("skipped_bad", 0),
    )


def encode_dir(data_cfg: DataConfig) -> Path:
    """`data.cache_dir`, else `encode/` in align's cache directory (align.core.caches)."""
    return Path(encode_location(data_cfg.cache_dir)["dir"])


def load_dataset(data_cfg: DataConfig, model_cfg: ModelConfig, tokenizer, save: bool = True) -> EncodedDataset:
    """The encoded data set of a run: from the cache when its key matches, else encoded (in worker
    processes) and cached (`save=False`: by `save_dataset`, later). `.meta` carries the provenance the
    manifest records."""
    t0 = time.perf_counter()
    if data_cfg.holds_pairs:
        raise ConfigError("data.source", "holds preference pairs (data=gsm8k_pairs or data=preference), which a "
                          "preference objective trains on; chat records: data=gsm8k, jsonl, parquet or tokens")
    parts = cache_key_parts(data_cfg, model_cfg)
    key = parts["key"]
    check_chat_template(tokenizer, model_cfg, parts)
    entry = encode_dir(data_cfg) / key
    hit = data_cfg.cache and (entry / "meta.json").is_file()
    if hit:
        data = _read_entry(entry, key)
    else:
        report: dict[str, Any] = {}
        records = load_records(data_cfg, report)
        excluded = load_mask_files(data_cfg.mask_files, records)
        data = encode_records(records, tokenizer, data_cfg, excluded, data_cfg.encode_workers)
        formats = report.pop("formats")
        data.stats.update(report)
        per_source = np.bincount(data.source_index, minlength=len(parts["sources"]))
        data.meta = {
            "encode_cache_key": key,
            "encode_version": ENCODE_VERSION,
            "fingerprint": None,
            "records_per_source": [int(n) for n in per_source],
            "formats": formats,
            **{k: parts[k] for k in ("tokenizer_sha256", "chat_template_sha256", "libraries")},
        }
        dataset_fingerprint(data)
        if save:
            save_dataset(data_cfg, data)
    provenance(data, parts, entry, data_cfg.cache, hit, time.perf_counter() - t0)
    log.info("data: %d records, %d tokens, encode cache %s (%s), %.2fs", len(data), data.stats["tokens"],
             "hit" if hit else "miss", key[:12], data.meta["load_seconds"])
    return data


def save_dataset(data_cfg: DataConfig, data: EncodedDataset) -> None:
    """Write a freshly encoded data set into the cache (nothing for a hit, or with data.cache=false)."""
    entry = encode_dir(data_cfg) / data.meta["encode_cache_key"]
    if data_cfg.cache and not data.meta.get("cache_hit") and not (entry / "meta.json").is_file():
        _write_entry(entry, data, {k: data.meta[k] for k in _CONTENT})
