"""Preference pairs: records -> validated (prompt, chosen, rejected) -> two encoded sequences per pair.

A record is one JSON object per line (or a row of any file align/data/files.py reads; a chat record
there is refused as a whole file, align/data/formats.py), in one of two forms:
- explicit: `{"prompt": P, "chosen": C, "rejected": R}`. P is a string (one user turn) or a chat
  (a list of {role, content} that does not end with an assistant turn); C and R are each a string or a
  list holding one assistant message.
- implicit prompt: `{"chosen": [chat], "rejected": [chat]}`, two whole conversations that share every
  turn but their last: the shared turns are the prompt, the two last (assistant) turns the completions.
Either form may carry a `margin`, TRL's RewardTrainer margin column (align/data/margins.py). A message's
content is a string or a list of text parts (align.data.formats.content_of).

Encoding renders prompt + completion through the tokenizer's chat template. The prompt's tokens are
those of the prompt rendered with the generation prompt, and they must be a token prefix of each side
(checked: the two sides then start from the same context). Only completion tokens carry loss: the
completion and the EOS that closes it (appended when the template leaves the answer open), exactly as
an SFT assistant turn (align/data/encode.py). Pair i becomes sequences 2i (prompt + chosen) and 2i + 1
(prompt + rejected) of one EncodedDataset, so everything that reads an encoded data set (collate, the
mask probe, the manifest) reads the pairs' sequences as they are.

Bad records (a missing side, chosen identical to rejected, an empty completion, a prompt with no room
for a completion within data.max_seq_len, malformed JSON or fields) are refused with file:line, or,
under data.on_bad_record=skip, counted per reason and dropped; the counts go into the manifest. A side
longer than data.max_seq_len follows data.truncation for the whole pair (drop it, cut the side from the
right and flag the pair truncated, or fail). The sides are compared again as the token rows the run
trains on, after the template and the cut: two sides that differ only past max_seq_len, or only in
what the template drops, are the same sequence (loss log 2, no gradient) and are a bad record too.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import numpy as np

from align.config import DataConfig, DataFormat, OnBadRecord, TrainConfig, Truncation
from align.data import formats, margins
from align.data.encode import EncodedDataset, dataset_fingerprint, map_with_tokenizer, resolve_workers
from align.data.encode_cache import (
    ENCODE_VERSION,
    PAIRING_VERSION,
    _read_raw,
    _write_entry,
    cache_key_parts,
    check_chat_template,
    encode_dir,
    provenance,
)
from align.data.sources import BadRecord, SourceSpec, _rows, source_format, source_specs
from align.errors import ConfigError

log = logging.getLogger("align")

SIDES = ("chosen", "rejected")
FORMAT = 'accepted: {"prompt": str | chat, "chosen": str | [assistant message], "rejected": ...} or two chats ' \
         '{"chosen": [...], "rejected": [...]} that differ only in their last (assistant) turn'


class BadPair(BadRecord):
    """A bad preference record; `reason` is the name it is counted under when skipped."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PreferenceRecord:
    id: str
    """`<source>:<line number>` (or `<source>:<id_field value>`)."""
    root: str
    """`<source>` or `<source>/<root_field>=<value>`, as for chat records."""
    where: str
    """`<file>:<line>`, what an error about this record names."""
    prompt: list[dict[str, str]]
    """The shared context: a chat that does not end with an assistant turn."""
    chosen: dict[str, str]
    """The preferred completion: one assistant message."""
    rejected: dict[str, str]
    """The dispreferred completion: one assistant message."""
    source: int = 0
    """Index of the record's source in `source_specs(cfg)`."""
    margin: Optional[float] = None
    """The record's `margin` (TRL's RewardTrainer margin column, align/data/margins.py); None: it has none."""


# --------------------------------------------------------------------------------------- parsing


def _message(m: Any, what: str) -> dict[str, str]:
    try:
        return formats.message(m, what)
    except BadRecord as e:
        raise BadPair("malformed", str(e)) from None


def _chat(value: Any, what: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise BadPair("malformed", f"'{what}' must be a string or a list of {{role, content}}; {FORMAT}")
    return [_message(m, f"'{what}'[{i}]") for i, m in enumerate(value)]


def _prompt(value: Any) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    chat = _chat(value, "prompt")
    if not chat or chat[-1]["role"] == "assistant":
        raise BadPair("malformed", "'prompt' must be a non-empty chat that does not end with an assistant turn "
                                   "(the completions are the assistant's answer to it)")
    return chat


def _completion(value: Any, side: str) -> dict[str, str]:
    if isinstance(value, str):
        return {"role": "assistant", "content": value}
    chat = _chat(value, side)
    if len(chat) != 1 or chat[0]["role"] != "assistant":
        raise BadPair("malformed", f"'{side}' must be a string or a list holding one assistant message "
                                   f"(got roles {[m['role'] for m in chat]})")
    return chat[0]


def _implicit(chosen: Any, rejected: Any) -> tuple[list[dict[str, str]], dict[str, str], dict[str, str]]:
    """Two whole conversations: their shared turns are the prompt, their last turns the completions."""
    if not isinstance(chosen, list) or not isinstance(rejected, list):
        raise BadPair("malformed", f"a record without 'prompt' needs 'chosen' and 'rejected' as chats; {FORMAT}")
    c, r = _chat(chosen, "chosen"), _chat(rejected, "rejected")
    if c == r:
        raise BadPair("identical", "'chosen' and 'rejected' are the same conversation: the pair prefers nothing")
    k = 0
    while k < min(len(c), len(r)) and c[k] == r[k]:
        k += 1
    if len(c) != k + 1 or len(r) != k + 1 or c[k]["role"] != "assistant" or r[k]["role"] != "assistant":
        raise BadPair("no_shared_prompt", f"'chosen' and 'rejected' must share every turn but their last, an assistant "
                                          f"turn (they share {k} of {len(c)} and {len(r)} turns)")
    if k == 0 or c[k - 1]["role"] == "assistant":
        raise BadPair("no_shared_prompt", "the shared turns (the prompt) must be non-empty and not end with an "
                                          "assistant turn")
    return c[:k], c[k], r[k]


def parse_record(row: dict, spec: SourceSpec, lineno: int, index: int) -> PreferenceRecord:
    """One record of a preference source, validated; raises BadPair naming what is wrong."""
    missing = [s for s in SIDES if row.get(s) is None]
    if missing:
        raise BadPair("missing_side", f"record has no '{missing[0]}' (keys: {sorted(row)}); {FORMAT}")
    if row.get("prompt") is not None:
        prompt = _prompt(row["prompt"])
        chosen, rejected = _completion(row["chosen"], "chosen"), _completion(row["rejected"], "rejected")
    else:
        prompt, chosen, rejected = _implicit(row["chosen"], row["rejected"])
    for side, m in zip(SIDES, (chosen, rejected)):
        if not m["content"].strip():
            raise BadPair("empty_completion", f"the '{side}' completion is empty: it would teach the model nothing "
                                              "to prefer")
    if chosen == rejected:
        raise BadPair("identical", "'chosen' and 'rejected' are identical: the pair prefers nothing")
    return PreferenceRecord(id=_field_id(row, spec, lineno), root=_root(row, spec), where=f"{spec.path}:{lineno}",
                            prompt=prompt, chosen=chosen, rejected=rejected, source=index,
                            margin=margins.parse_margin(row))


def _field_id(row: dict, spec: SourceSpec, lineno: int) -> str:
    if spec.id_field is None:
        return f"{spec.name}:{lineno}"
    if spec.id_field not in row:
        raise BadPair("malformed", f"record has no id field '{spec.id_field}' (data.id_field)")
    return f"{spec.name}:{row[spec.id_field]}"


def _root(row: dict, spec: SourceSpec) -> str:
    if spec.root_field is None:
        return spec.name
    if spec.root_field not in row:
        raise BadPair("malformed", f"record has no root field '{spec.root_field}' (data.root_field)")
    return f"{spec.name}/{spec.root_field}={row[spec.root_field]}"


class BadRecords:
    """Bad records: refused (exit 2, naming file:line) or, under on_bad_record=skip, counted per reason."""

    def __init__(self, policy: OnBadRecord) -> None:
        self.policy = policy
        self.where: list[str] = []
        self.by_reason: dict[str, int] = {}

    def __call__(self, where: str, e: BadRecord) -> None:
        if self.policy == OnBadRecord.fail:
            raise ConfigError(where, f"{e} (set data.on_bad_record=skip to skip such records)") from None
        reason = getattr(e, "reason", "malformed")
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        self.where.append(f"{where}: {e}")

    def report(self) -> dict[str, Any]:
        if self.where:
            log.warning("data: skipped %d bad preference record(s), first: %s", len(self.where), self.where[0])
        return {"skipped_bad": len(self.where), "skipped_by_reason": dict(sorted(self.by_reason.items())),
                "skipped_where": self.where[:100]}


def load_preference_records(cfg: DataConfig, bad: BadRecords,
                            chosen: Optional[dict[str, Any]] = None) -> list[PreferenceRecord]:
    """Every preference record of every source, in order (the first `max_records` usable ones of each);
    each source's format (align.data.sources.source_format) goes into `chosen`."""
    records: list[PreferenceRecord] = []
    seen: set[str] = set()
    for index, spec in enumerate(source_specs(cfg)):
        n, skipped = 0, len(bad.where)
        rows = list(_rows(spec))  # the whole source: a file of chat records is refused as one
        fmt, how = formats.resolve(rows, spec, True)
        if chosen is not None:
            chosen[spec.name] = source_format(spec, fmt or DataFormat.preference, how)
        for lineno, row in rows:
            where = f"{spec.path}:{lineno}"
            try:
                if isinstance(row, BadRecord):
                    raise row
                rec = parse_record(row, spec, lineno, index)
                if rec.id in seen:
                    raise BadPair("duplicate_id", f"duplicate record id {rec.id!r}")
            except BadRecord as e:
                bad(where, e)
                continue
            seen.add(rec.id)
            records.append(rec)
            n += 1
            if cfg.max_records is not None and n >= cfg.max_records:
                break
        if n == 0:
            skipped = len(bad.where) - skipped
            raise ConfigError(spec.key, f"no usable preference records in {spec.path}"
                              + (f" ({skipped} skipped as bad)" if skipped else ""))
    return records


def check_pair_sources(cfg: DataConfig) -> None:
    """Refuse chat-record sources (and mask files, which name chat turns) where pairs are expected."""
    if not cfg.holds_pairs:
        kind = next(iter(cfg.mixture.values())).kind if cfg.mixture else cfg.source
        raise ConfigError("data.mixture" if cfg.mixture else "data.source",
                          f"a preference objective trains on preference pairs, got {kind.value} (chat records); "
                          "accepted: data=gsm8k_pairs (bundled) or data=preference data.path=pairs.jsonl")
    if cfg.mask_files:
        raise ConfigError("data.mask_files", "name turns of chat records; a preference pair's loss covers its two "
                                             "completions by construction: leave data.mask_files empty")


# -------------------------------------------------------------------------------------- encoding


@dataclass
class EncodedPairs(EncodedDataset):
    """Encoded pairs: pair i is sequences 2i (prompt + chosen) and 2i + 1 (prompt + rejected). What is
    inherited (tokens, loss_mask, offsets, ids, roots, source_index, lengths, row) is per SEQUENCE, so
    every reader of an encoded data set works on it unchanged; the pair views are below."""

    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """bool per pair: a side was cut at data.max_seq_len (data.truncation=truncate)."""
    pair_ids: list[str] = field(default_factory=list)
    """Record id per pair (the sequences' ids are `<pair id>/chosen` and `<pair id>/rejected`)."""
    margin: Optional[np.ndarray] = None
    """float64 per pair: its record's `margin` (align/data/margins.py); None: the data carry no margin."""

    @property
    def pairs(self) -> int:
        return len(self.pair_ids)

    @property
    def pair_lengths(self) -> np.ndarray:
        """Tokens of each pair, both sides (a sequence's own length is `lengths`)."""
        lens = self.lengths
        return lens[0::2] + lens[1::2]

    @property
    def side_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(chosen, rejected) lengths per pair."""
        lens = self.lengths
        return lens[0::2], lens[1::2]


def render_ids(tok, messages: list[dict[str, str]], **kw) -> list[int]:
    return tok(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False)["input_ids"]


def encode_side(tok, prompt_ids: list[int], prompt: list[dict[str, str]], completion: dict[str, str]) -> list[int]:
    """Token ids of prompt + completion, closed by EOS; raises BadPair when the prompt is not a prefix."""
    ids = render_ids(tok, [*prompt, completion])
    if ids[: len(prompt_ids)] != prompt_ids:
        raise BadPair("template_prefix", "the chat template does not render the prompt (with its generation prompt) "
                                         "as a token prefix of prompt + completion: no loss mask can be cut")
    if tok.eos_token_id not in ids[len(prompt_ids):]:
        ids.append(tok.eos_token_id)  # the template leaves the answer open: close it so the model learns to stop
    return ids


def encode_pair(tok, rec: PreferenceRecord, max_seq_len: int) -> tuple[int, list[int], list[int]]:
    """(prompt length, chosen ids, rejected ids), unbounded; raises BadPair for a prompt with no room."""
    prompt_ids = render_ids(tok, rec.prompt, add_generation_prompt=True)
    if len(prompt_ids) >= max_seq_len:
        raise BadPair("prompt_too_long", f"the prompt is {len(prompt_ids)} tokens: data.max_seq_len={max_seq_len} "
                                         "leaves no room for a completion")
    return len(prompt_ids), encode_side(tok, prompt_ids, rec.prompt, rec.chosen), \
        encode_side(tok, prompt_ids, rec.prompt, rec.rejected)


def _encode_item(tok, item: tuple[PreferenceRecord, int]) -> tuple[int, list[int], list[int]] | tuple[str, str]:
    # A bad pair comes back as (reason, message): an exception raised in a worker would end the pool.
    try:
        return encode_pair(tok, *item)
    except BadPair as e:
        return e.reason, str(e)


def encode_pairs(records: Sequence[PreferenceRecord], tok, cfg: DataConfig, bad: BadRecords,
                 workers: Optional[int] = 0) -> EncodedPairs:
    """Encode every pair (in `workers` processes, as chat records: align.data.encode.resolve_workers),
    apply the truncation policy per pair; the report goes into `stats`."""
    seqs: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    kept: list[PreferenceRecord] = []
    truncated: list[bool] = []
    dropped: list[str] = []
    m = cfg.max_seq_len
    items = [(r, m) for r in records]
    for rec, out in zip(records, map_with_tokenizer(_encode_item, items, tok, resolve_workers(workers, len(items)))):
        if len(out) == 2:
            bad(rec.where, BadPair(*out))
            continue
        n_prompt, chosen, rejected = out
        longest = max(len(chosen), len(rejected))
        if longest > m:
            if cfg.truncation == Truncation.fail:
                raise ConfigError(rec.where, f"a side of pair {rec.id} has {longest} tokens, more than "
                                  f"data.max_seq_len={m} (data.truncation=fail; accepted: drop, truncate, or a larger "
                                  "data.max_seq_len)")
            if cfg.truncation == Truncation.drop:
                dropped.append(rec.id)
                continue
        chosen, rejected = chosen[:m], rejected[:m]
        if chosen == rejected:  # the text check (parse_record) cannot see what the template and the cut do
            bad(rec.where, _collapsed(len(chosen), longest > m, m))
            continue
        for ids in (chosen, rejected):
            seqs.append(np.asarray(ids, dtype=np.int32))
            masks.append(np.arange(len(ids)) >= n_prompt)
        kept.append(rec)
        truncated.append(longest > m)
    if not kept:
        raise ConfigError("data.max_seq_len", f"no pair is left to train on: {len(dropped)} longer than {m} tokens "
                          f"(data.truncation={cfg.truncation.value}), {len(bad.where)} skipped as bad"
                          + (f" ({n} of them identical once encoded)" if (n := _collapsed_count(bad)) else ""))
    return _assemble(kept, seqs, masks, truncated, dropped, cfg, len(records))


def _collapsed(n: int, cut: bool, max_seq_len: int) -> BadPair:
    """Two sides encoded to the same tokens: both log-probs are equal, so the loss is log 2 with no
    gradient, whatever the policy learns."""
    if cut:
        return BadPair("identical_after_truncation",
                       f"'chosen' and 'rejected' differ only past data.max_seq_len={max_seq_len}: cut there "
                       f"(data.truncation=truncate) both are the same {n} tokens and the pair prefers nothing; "
                       "accepted: a larger data.max_seq_len, data.truncation=drop, or sides that differ within it")
    return BadPair("identical_tokens",
                   f"'chosen' and 'rejected' differ as text but render to the same {n} tokens through the chat "
                   "template (e.g. it trims whitespace): the pair prefers nothing; accepted: sides that differ "
                   "in what the template keeps")


def _collapsed_count(bad: BadRecords) -> int:
    return sum(n for r, n in bad.by_reason.items() if r in ("identical_after_truncation", "identical_tokens"))


def _assemble(kept: list[PreferenceRecord], seqs: list[np.ndarray], masks: list[np.ndarray], truncated: list[bool],
              dropped: list[str], cfg: DataConfig, n_in: int) -> EncodedPairs:
    lengths = np.array([len(t) for t in seqs], dtype=np.int64)
    flags = np.asarray(truncated, dtype=bool)
    stats: dict[str, Any] = {
        "records_in": n_in,
        "records_kept": len(kept),
        "pairs": len(kept),
        "truncation_policy": cfg.truncation.value,
        "max_seq_len": cfg.max_seq_len,
        "dropped_too_long": len(dropped),
        "truncated": int(flags.sum()),
        "dropped_no_loss": 0,  # a completion is never empty and always ends in EOS
        "dropped_ids": dropped[:100],
        "truncated_ids": [r.id for r, t in zip(kept, truncated) if t][:100],
        "loss_tokens": int(sum(int(mk.sum()) for mk in masks)),
        "tokens": int(lengths.sum()),
        "margin": margins.stats(kept),
    }
    return EncodedPairs(
        tokens=np.concatenate(seqs), loss_mask=np.concatenate(masks),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        ids=[f"{r.id}/{side}" for r in kept for side in SIDES], roots=[r.root for r in kept for _ in SIDES],
        source_index=np.repeat(np.asarray([r.source for r in kept], dtype=np.int32), 2), stats=stats,
        truncated=flags, pair_ids=[r.id for r in kept],
        margin=None if stats["margin"] is None else np.array([r.margin for r in kept], dtype=np.float64),
    )


def pairs_fingerprint(pairs: EncodedPairs) -> str:
    """The data set fingerprint a resume checks (align.data.encode.dataset_fingerprint), covering the
    pair flags and layout too; kept in `meta` so every reader of the fingerprint gets this one."""
    if not pairs.meta.get("fingerprint"):
        base = dataset_fingerprint(EncodedDataset(pairs.tokens, pairs.loss_mask, pairs.offsets, pairs.ids, pairs.roots,
                                                  source_index=pairs.source_index))
        h = hashlib.sha256(f"pairs:{PAIRING_VERSION}:{base}|".encode())
        h.update(np.ascontiguousarray(pairs.truncated).tobytes() + "\n".join(pairs.pair_ids).encode())
        if pairs.margin is not None:  # a resume on other margins is other data
            h.update(b"margin" + np.ascontiguousarray(pairs.margin, dtype=np.float64).tobytes())
        pairs.meta["fingerprint"] = h.hexdigest()
    return pairs.meta["fingerprint"]


# ----------------------------------------------------------------------------------------- cache


_PAIR_ARRAYS = ("truncated", "margin")
_PAIR_META = ("pair_ids",)
NO_MARGIN = np.zeros(0, dtype=np.float64)
"""A cache entry's margin array for pairs without one (no pair set is empty)."""


def load_pairs(cfg: TrainConfig, tokenizer) -> EncodedPairs:
    """The encoded pairs of a run: from the encode cache when its key matches (the key covers the
    pairing: align.data.encode_cache.PAIRING_VERSION), else encoded and cached. `.meta` is the provenance the
    manifest records, `.stats` the counts (records in/kept, skipped per reason, truncated, dropped)."""
    t0 = time.perf_counter()
    data_cfg = cfg.data
    check_pair_sources(data_cfg)
    parts = cache_key_parts(data_cfg, cfg.model)
    key = parts["key"]
    check_chat_template(tokenizer, cfg.model, parts)
    entry = encode_dir(data_cfg) / key
    hit = data_cfg.cache and (entry / "meta.json").is_file()
    if hit:
        meta, arrays = _read_raw(entry, key, _PAIR_ARRAYS)
        arrays["margin"] = arrays["margin"] if len(arrays["margin"]) else None
        pairs = EncodedPairs(ids=meta["ids"], roots=meta["roots"], stats=meta["stats"], meta=dict(meta["content"]),
                             pair_ids=meta["pair_ids"], **arrays)
    else:
        pairs = _encode(data_cfg, tokenizer, parts)
        if data_cfg.cache:
            stored = pairs if pairs.margin is not None else replace(pairs, margin=NO_MARGIN)
            _write_entry(entry, stored, pairs.meta, _PAIR_ARRAYS, _PAIR_META)
    margins.refuse_unread(pairs.stats.get("margin"), cfg.objective)
    provenance(pairs, parts, entry, data_cfg.cache, hit, time.perf_counter() - t0)
    log.info("data: %d pairs, %d tokens, encode cache %s (%s), %.2fs", pairs.pairs, pairs.stats["tokens"],
             "hit" if hit else "miss", key[:12], pairs.meta["load_seconds"])
    return pairs


def _encode(data_cfg: DataConfig, tokenizer, parts: dict[str, Any]) -> EncodedPairs:
    bad = BadRecords(data_cfg.on_bad_record)
    chosen: dict[str, Any] = {}
    records = load_preference_records(data_cfg, bad, chosen)
    margins.check_column(records)
    pairs = encode_pairs(records, tokenizer, data_cfg, bad, data_cfg.encode_workers)
    pairs.stats.update(bad.report())
    per_source = np.bincount(pairs.source_index[0::2], minlength=len(parts["sources"]))
    pairs.meta = {
        "encode_cache_key": parts["key"],
        "encode_version": ENCODE_VERSION,
        "pairing_version": PAIRING_VERSION,
        "fingerprint": None,
        "records_per_source": [int(n) for n in per_source],
        "formats": chosen,
        **{k: parts[k] for k in ("tokenizer_sha256", "chat_template_sha256", "libraries")},
    }
    pairs_fingerprint(pairs)
    return pairs

