"""Encoding: render each record through the chat template, tokenize, and mark loss tokens.

A token is trained on only when it belongs to an assistant turn: for assistant turn i the tokens
between render(messages[:i], add_generation_prompt=True) and render(messages[:i+1]) are the answer,
and EOS closes it. Prompt tokens, role markers and system turns get no loss, nor do the turns that
an auxiliary mask file excludes (align.data.masks) or a prompt/completion record's prompt holds
(`Record.untrained`). A `text` record has no chat: its text is tokenized as the tokenizer takes plain
text, EOS closes it, and every token but the first (which nothing predicts) is a target. Records are
encoded in worker processes; the result is identical to encoding in-process (tested), so the worker
count is not part of the cache key.
"""

from __future__ import annotations

import functools
import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from typing import Any, Callable, Optional, Sequence

import numpy as np

from align.config import DataConfig, Truncation
from align.data.sources import Record
from align.errors import ConfigError

AUTO_INPROCESS_BELOW = 2000  # records: under this, starting worker processes costs more than it saves


@dataclass
class EncodedDataset:
    """Encoded records as flat arrays: record i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: np.ndarray  # int32
    loss_mask: np.ndarray  # bool, True where the token is a training target
    offsets: np.ndarray  # int64, len = n + 1
    ids: list[str]
    roots: list[str]
    stats: dict = field(default_factory=dict)
    """Counts of the encode: records in/kept, truncation report, skipped bad records, tokens."""
    source_index: Optional[np.ndarray] = None
    """int32 per record: index of its source in `source_specs(cfg)` (mixture weights apply per source)."""
    meta: dict = field(default_factory=dict)
    """Provenance for the manifest: encode_cache_key, content sha256 of every input, ENCODE_VERSION,
    cache_hit, fingerprint (see align.data.encode_cache.load_dataset)."""

    def __post_init__(self) -> None:
        if self.source_index is None:
            self.source_index = np.zeros(len(self.ids), dtype=np.int32)

    def __len__(self) -> int:
        return len(self.ids)

    # Provenance by attribute, for the manifest (align.run.record reads these names).
    @property
    def cache_key(self) -> Optional[str]:
        return self.meta.get("encode_cache_key")

    @property
    def tokenizer_sha256(self) -> Optional[str]:
        return self.meta.get("tokenizer_sha256")

    @property
    def chat_template_sha256(self) -> Optional[str]:
        return self.meta.get("chat_template_sha256")

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.loss_mask[a:b]


def dataset_fingerprint(data: EncodedDataset) -> str:
    """sha256 of what the sampler and collate read (tokens, masks, boundaries, ids, roots, sources):
    a resume refuses to continue on a data set whose fingerprint differs (docs/pitfalls.md#15)."""
    fp = data.meta.get("fingerprint")
    if fp:
        return fp
    h = hashlib.sha256()
    for a in (data.tokens, data.loss_mask, data.offsets, data.source_index):
        h.update(str(a.dtype).encode() + b"|" + np.ascontiguousarray(a).tobytes())
    h.update("\n".join(data.ids).encode() + b"\0" + "\n".join(data.roots).encode())
    data.meta["fingerprint"] = h.hexdigest()
    return data.meta["fingerprint"]


def _render(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def encode_one(tok, record: Record, exclude: frozenset[int] | set[int] = frozenset()) -> tuple[list[int], list[bool]]:
    """Token ids and loss mask of one record (unbounded length); turns in `exclude` get no loss."""
    if record.tokens is not None:  # pre-tokenized: as given; position 0 has no previous token to predict it
        mask = list(record.loss_mask) if record.loss_mask is not None else [True] * len(record.tokens)
        return list(record.tokens), [False] + mask[1:]
    if record.text is not None:
        ids = list(tok(record.text)["input_ids"])
        if not ids or ids[-1] != tok.eos_token_id:
            ids.append(tok.eos_token_id)  # close the text so the model learns to stop
        return ids, [False] + [True] * (len(ids) - 1)
    msgs = record.messages
    memo: dict[str, list[int]] = {}

    def ids_of(text: str) -> list[int]:
        if text not in memo:
            memo[text] = tok(text, add_special_tokens=False)["input_ids"]
        return memo[text]

    ids = list(ids_of(_render(tok, msgs)))
    mask = [False] * len(ids)
    eos = tok.eos_token_id
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if not turns:
        raise ConfigError(record.id, "record has no assistant turn to train on")
    for i in turns:
        start = len(ids_of(_render(tok, msgs[:i], add_generation_prompt=True)))
        end = len(ids_of(_render(tok, msgs[: i + 1])))  # the last turn renders the whole chat again: memoised
        if end > len(ids) or start >= end:
            raise ConfigError(record.id, "chat template is not prefix-stable: a rendered turn is not a token prefix "
                                         "of the whole chat")
        if eos not in ids[start:end] and i == len(msgs) - 1:
            # The template leaves the answer open: close it so the model learns to stop.
            ids.append(eos)
            mask.append(False)
            end += 1
        if i in exclude:
            continue
        for t in range(start, end):
            mask[t] = True
    return ids, mask


# ------------------------------------------------------------------------------- worker processes

_WORKER_TOK = None


def _worker_init(tok) -> None:
    global _WORKER_TOK
    _WORKER_TOK = tok


def _map_chunk(fn: Callable[[Any, Any], Any], chunk: list) -> list:
    return [fn(_WORKER_TOK, item) for item in chunk]


def _encode_item(tok, item: tuple[Record, frozenset[int]]) -> tuple[np.ndarray, np.ndarray]:
    return _pack(*encode_one(tok, *item))


def _pack(t: list[int], m: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(t, dtype=np.int32), np.asarray(m, dtype=bool)


def resolve_workers(requested: Optional[int], n_records: int) -> int:
    if requested is not None:
        return requested
    if n_records < AUTO_INPROCESS_BELOW:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # Under torchrun every local rank may encode at once: share the cores.
    per_rank = max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    return min(8, per_rank)


def map_with_tokenizer(fn: Callable[[Any, Any], Any], items: Sequence[Any], tok, workers: int) -> list:
    """`fn(tok, item)` for every item, in order, in `workers` processes (0: in-process). `fn` must be a
    module-level function (the workers get it by reference)."""
    if workers <= 0:
        return [fn(tok, item) for item in items]
    n_chunks = workers * 4
    size = -(-len(items) // n_chunks)
    chunks = [list(items[i : i + size]) for i in range(0, len(items), size)]
    # fork: the workers inherit the loaded tokenizer (spawn would re-import transformers and reload
    # it in each worker, seconds on 2 cores). They run no torch op and no tokenizer batch (the Rust
    # thread pool, which tokenizers itself disables after a fork), so no thread state is at risk.
    # Where fork is missing, spawn pickles the tokenizer (slower, same result).
    ctx = get_context("fork" if "fork" in get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(tok,)) as pool:
        return [x for part in pool.map(functools.partial(_map_chunk, fn), chunks) for x in part]


def encode_all(records: Sequence[Record], tok, excluded: dict[str, set[int]],
               workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Encode every record, in order, in `workers` processes (0: in-process)."""
    items = [(r, frozenset(excluded.get(r.id, ())) | frozenset(r.untrained)) for r in records]
    return map_with_tokenizer(_encode_item, items, tok, workers)


def encode_records(records: Sequence[Record], tok, cfg: DataConfig,
                   excluded: Optional[dict[str, set[int]]] = None, workers: Optional[int] = 0) -> EncodedDataset:
    """Encode, then apply the truncation policy; the truncation report goes into `stats`."""
    excluded = excluded or {}
    encoded = encode_all(records, tok, excluded, resolve_workers(workers, len(records)))

    tokens: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    ids: list[str] = []
    roots: list[str] = []
    sources: list[int] = []
    dropped: list[str] = []
    truncated: list[str] = []
    no_loss: list[str] = []
    for r, (t, m) in zip(records, encoded):
        if len(t) > cfg.max_seq_len:
            if cfg.truncation == Truncation.fail:
                raise ConfigError("data.max_seq_len", f"record {r.id} has {len(t)} tokens, more than {cfg.max_seq_len} "
                                  "(data.truncation=fail; accepted: drop, truncate, or a larger data.max_seq_len)")
            if cfg.truncation == Truncation.drop:
                dropped.append(r.id)
                continue
            t, m = t[: cfg.max_seq_len], m[: cfg.max_seq_len]
            truncated.append(r.id)
        if not m.any():
            no_loss.append(r.id)  # fully masked, or truncated before its answer: costs compute, teaches nothing
            continue
        tokens.append(t)
        masks.append(m)
        ids.append(r.id)
        roots.append(r.root)
        sources.append(r.source)
    if not ids:
        raise ConfigError("data.max_seq_len",
                          f"no record is left to train on: {len(dropped)} longer than {cfg.max_seq_len} "
                          f"tokens (data.truncation={cfg.truncation.value}), {len(no_loss)} without loss tokens")
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    stats: dict[str, Any] = {
        "records_in": len(records),
        "records_kept": len(ids),
        "truncation_policy": cfg.truncation.value,
        "max_seq_len": cfg.max_seq_len,
        "dropped_too_long": len(dropped),
        "truncated": len(truncated),
        "dropped_no_loss": len(no_loss),
        "dropped_ids": dropped[:100],
        "truncated_ids": truncated[:100],
        "no_loss_ids": no_loss[:100],
        "masked_turns": sum(len(v) for v in excluded.values()),
        "loss_tokens": int(sum(int(m.sum()) for m in masks)),
        "tokens": int(lengths.sum()),
    }
    return EncodedDataset(
        tokens=np.concatenate(tokens), loss_mask=np.concatenate(masks), offsets=offsets, ids=ids, roots=roots,
        stats=stats, source_index=np.asarray(sources, dtype=np.int32),
    )
