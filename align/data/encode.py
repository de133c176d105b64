"""Encoding: render each record through the chat template, tokenize, and mark loss tokens.

A token is trained on only when it belongs to an assistant turn: for assistant turn i the tokens
between render(messages[:i], add_generation_prompt=True) and render(messages[:i+1]) are the answer,
and EOS closes it. Prompt tokens, role markers and system turns get no loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from align.config import DataConfig, Truncation
from align.data.sources import Record
from align.errors import ConfigError


@dataclass
class EncodedDataset:
    """Encoded records as flat arrays: record i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: np.ndarray  # int32
    loss_mask: np.ndarray  # bool, True where the token is a training target
    offsets: np.ndarray  # int64, len = n + 1
    ids: list[str]
    roots: list[str]
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.loss_mask[a:b]


def _render(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def encode_one(tok, record: Record) -> tuple[list[int], list[bool]]:
    """Token ids and loss mask of one record (unbounded length)."""
    msgs = record.messages
    ids = tok(_render(tok, msgs), add_special_tokens=False)["input_ids"]
    mask = [False] * len(ids)
    eos = tok.eos_token_id
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if not turns:
        raise ConfigError(record.id, "record has no assistant turn to train on")
    for i in turns:
        start = len(tok(_render(tok, msgs[:i], add_generation_prompt=True), add_special_tokens=False)["input_ids"])
        end = len(tok(_render(tok, msgs[: i + 1]), add_special_tokens=False)["input_ids"])
        if end > len(ids) or start >= end:
            raise ConfigError(record.id, "chat template is not prefix-stable: a rendered turn is not a token prefix of the whole chat")
        for t in range(start, end):
            mask[t] = True
        if eos not in ids[start:end] and i == len(msgs) - 1:
            # The template leaves the answer open: close it so the model learns to stop.
            ids.append(eos)
            mask.append(True)
    return ids, mask


def encode_records(records: Sequence[Record], tok, cfg: DataConfig) -> EncodedDataset:
    tokens: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    ids: list[str] = []
    roots: list[str] = []
    dropped: list[str] = []
    truncated: list[str] = []
    for r in records:
        t, m = encode_one(tok, r)
        if len(t) > cfg.max_seq_len:
            if cfg.truncation == Truncation.drop:
                dropped.append(r.id)
                continue
            t, m = t[: cfg.max_seq_len], m[: cfg.max_seq_len]
            if not any(m):
                dropped.append(r.id)
                continue
            truncated.append(r.id)
        tokens.append(np.asarray(t, dtype=np.int32))
        masks.append(np.asarray(m, dtype=bool))
        ids.append(r.id)
        roots.append(r.root)
    if not ids:
        raise ConfigError("data.max_seq_len", f"every record is longer than {cfg.max_seq_len} tokens; nothing to train on")
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    stats = {
        "records_in": len(records),
        "records_kept": len(ids),
        "dropped_too_long": len(dropped),
        "truncated": len(truncated),
        "dropped_ids": dropped[:100],
        "truncated_ids": truncated[:100],
        "loss_tokens": int(sum(m.sum() for m in masks)),
        "tokens": int(lengths.sum()),
    }
    return EncodedDataset(
        tokens=np.concatenate(tokens), loss_mask=np.concatenate(masks), offsets=offsets, ids=ids, roots=roots, stats=stats
    )
