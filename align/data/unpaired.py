"""Unpaired examples for objective=kto: records -> (prompt, completion, label) -> two encoded sequences each.

A record (one JSON object per line, or a row of any file align/data/files.py reads) is one of:
- unpaired, TRL's unpaired-preference format: `{"prompt": P, "completion": C, "label": true | false}`,
  P a string or a chat that does not end with an assistant turn, C a string or a list holding one
  assistant message, `label` a JSON boolean (true: desirable);
- a preference pair in either form align/data/preference.py reads, unpaired as TRL's
  `unpair_preference_dataset` does: the chosen completion is desirable, the rejected one undesirable (a
  pair's `margin` has nowhere to go: refused, align/data/margins.py).
  A source's pairs give its chosen examples first, then its rejected ones, each in record order (TRL's
  order within one of its map batches), so neighbours hold different prompts.
A source holds one form or the other. Bad records (a missing key, a label that is not a boolean, an
empty completion, a prompt with no room in data.max_seq_len) are refused with file:line, or counted and
dropped under data.on_bad_record=skip, as preference records are.

Example i is sequences 2i and 2i + 1 of one EncodedPairs, so the pair stream, collate, the precomputed
reference table, the step-0 gate and the manifest read it as a pair:
- 2i: prompt_i + completion_i, the completion (and its closing EOS) in the loss, cut per data.truncation;
- 2i + 1: its KL sequence, prompt_i + completion_j (token ids, concatenated as TRL's collator does),
  cut at data.max_seq_len. j is the example before i (cyclically), TRL's rotation of completions by one
  (kto_trainer.py, "add_kl_completion_ids"), stepping further back past examples whose prompt is the
  same as i's, so every KL sequence pairs a prompt with another prompt's completion. TRL rotates within
  each batch of its sequential sampler; here the rotation runs over the whole data set, since the
  samplers shuffle examples (the KL estimate needs mismatched pairs, not a batch's own completions).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from align.config import DataConfig, TrainConfig, Truncation
from align.data import margins
from align.data.encode import map_with_tokenizer, resolve_workers
from align.data.encode_cache import (
    ENCODE_VERSION,
    PAIRING_VERSION,
    _read_raw,
    _write_entry,
    cache_key_parts,
    check_chat_template,
    encode_cache_key,
    encode_dir,
    provenance,
)
from align.data.preference import (
    BadPair,
    BadRecords,
    EncodedPairs,
    _completion,
    _field_id,
    _prompt,
    _root,
    check_pair_sources,
    encode_side,
    pairs_fingerprint,
    parse_record,
    render_ids,
)
from align.data.sources import BadRecord, SourceSpec, _rows, source_format, source_specs
from align.errors import ConfigError

log = logging.getLogger("align")

UNPAIRING_VERSION = 1
"""Bump whenever an example's two sequences can change for identical records: the unpairing order, the
KL partner rule, what the KL sequence holds or how it is cut. Part of the encode cache key."""
SIDES = ("completion", "kl")
FORMAT = 'accepted: {"prompt": str | chat, "completion": str | [assistant message], "label": true | false}, ' \
         'or a preference pair ({"prompt", "chosen", "rejected"}: chosen -> label true, rejected -> label false)'


@dataclass(frozen=True)
class Example:
    id: str
    root: str
    where: str
    prompt: list[dict[str, str]]
    completion: dict[str, str]
    label: bool
    """True: a desirable completion."""
    source: int = 0


def parse_unpaired(row: dict, spec: SourceSpec, lineno: int, index: int) -> Example:
    """One unpaired record, validated; raises BadPair naming the key that is wrong."""
    missing = [k for k in ("prompt", "completion", "label") if row.get(k) is None]
    if missing:
        raise BadPair("missing_key", f"record has no '{missing[0]}' (keys: {sorted(row)}); {FORMAT}")
    if not isinstance(row["label"], bool):
        raise BadPair("label", f"'label' must be a JSON boolean, true (desirable) or false (undesirable) "
                               f"(got {row['label']!r})")
    completion = _completion(row["completion"], "completion")
    if not completion["content"].strip():
        raise BadPair("empty_completion", "the completion is empty: it would teach the model nothing")
    return Example(id=_field_id(row, spec, lineno), root=_root(row, spec), where=f"{spec.path}:{lineno}",
                   prompt=_prompt(row["prompt"]), completion=completion, label=row["label"], source=index)


def _is_pair(row: Any) -> bool:
    return isinstance(row, dict) and (row.get("chosen") is not None or row.get("rejected") is not None)


def load_examples(cfg: DataConfig, bad: BadRecords, formats: Optional[dict[str, Any]] = None) -> list[Example]:
    """Every example of every source, in order (module doc); the first `max_records` usable records of each."""
    examples: list[Example] = []
    seen: set[str] = set()
    for index, spec in enumerate(source_specs(cfg)):
        rows = list(_rows(spec))
        kinds = {}
        for n, row in rows:
            if isinstance(row, dict):
                kinds.setdefault("preference" if _is_pair(row) else "unpaired", f"{spec.path}:{n}")
        if len(kinds) > 1:
            raise ConfigError(f"{spec.key}.path", "the records mix unpaired examples and preference pairs ("
                              + ", ".join(f"{k} at {w}" for k, w in kinds.items()) + f"); {FORMAT}, one form per file")
        pairs = "preference" in kinds
        if formats is not None:
            formats[spec.name] = source_format(spec, None, "detected") | {"format": next(iter(kinds), None)}
        chosen, rejected, n, skipped = [], [], 0, len(bad.where)
        for lineno, row in rows:
            where = f"{spec.path}:{lineno}"
            try:
                if isinstance(row, BadRecord):
                    raise row
                if pairs:
                    rec = parse_record(row, spec, lineno, index)
                    if rec.margin is not None:
                        margins.refuse_unpaired(rec.where)
                    side = {"id": rec.id, "root": rec.root, "where": rec.where, "prompt": rec.prompt, "source": index}
                    new = [Example(**side, completion=rec.chosen, label=True),
                           Example(**side, completion=rec.rejected, label=False)]
                else:
                    new = [parse_unpaired(row, spec, lineno, index)]
                if new[0].id in seen:
                    raise BadPair("duplicate_id", f"duplicate record id {new[0].id!r}")
            except BadRecord as e:
                bad(where, e)
                continue
            seen.add(new[0].id)
            chosen.append(new[0])
            rejected.extend(new[1:])
            n += 1
            if cfg.max_records is not None and n >= cfg.max_records:
                break
        if n == 0:
            skipped = len(bad.where) - skipped
            raise ConfigError(spec.key, f"no usable records in {spec.path}"
                              + (f" ({skipped} skipped as bad)" if skipped else "") + f"; {FORMAT}")
        examples += [_suffixed(e, "chosen") for e in chosen] + [_suffixed(e, "rejected") for e in rejected] \
            if pairs else chosen
    return examples


def _suffixed(e: Example, side: str) -> Example:
    """An unpaired side of a pair: its id names the side, so ids stay unique."""
    return Example(id=f"{e.id}/{side}", root=e.root, where=e.where, prompt=e.prompt, completion=e.completion,
                   label=e.label, source=e.source)


# -------------------------------------------------------------------------------------- encoding


@dataclass
class EncodedExamples(EncodedPairs):
    """Encoded examples: example i is sequences 2i (prompt + completion) and 2i + 1 (its KL sequence).
    `pairs`, `pair_ids`, `truncated` count examples (the pair machinery reads them as pairs)."""

    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """bool per example: the completion is desirable."""
    kl_partner: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Per example, the example whose completion its KL sequence holds."""


def _encode_item(tok, item: tuple[Example, int]) -> tuple[int, list[int]] | tuple[str, str]:
    # A bad example comes back as (reason, message): an exception raised in a worker would end the pool.
    ex, max_seq_len = item
    prompt_ids = render_ids(tok, ex.prompt, add_generation_prompt=True)
    if len(prompt_ids) >= max_seq_len:
        return "prompt_too_long", (f"the prompt is {len(prompt_ids)} tokens: data.max_seq_len={max_seq_len} "
                                   "leaves no room for a completion")
    try:
        return len(prompt_ids), encode_side(tok, prompt_ids, ex.prompt, ex.completion)
    except BadPair as e:
        return e.reason, str(e)


def kl_partners(prompts: list[tuple[int, ...]]) -> np.ndarray:
    """Per example, the nearest example before it (cyclically) whose prompt differs (module doc)."""
    n = len(prompts)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        j = (i - 1) % n
        while prompts[j] == prompts[i] and j != i:
            j = (j - 1) % n
        out[i] = j
    return out


def encode_examples(examples: list[Example], tok, cfg: DataConfig, bad: BadRecords,
                    workers: Optional[int] = 0) -> EncodedExamples:
    m = cfg.max_seq_len
    kept: list[tuple[Example, int, list[int]]] = []
    dropped: list[str] = []
    items = [(e, m) for e in examples]
    for ex, out in zip(examples, map_with_tokenizer(_encode_item, items, tok, resolve_workers(workers, len(items)))):
        if isinstance(out[0], str):
            bad(ex.where, BadPair(*out))
            continue
        n_prompt, ids = out
        if len(ids) > m:
            if cfg.truncation == Truncation.fail:
                raise ConfigError(ex.where, f"example {ex.id} has {len(ids)} tokens, more than data.max_seq_len={m} "
                                  "(data.truncation=fail; accepted: drop, truncate, or a larger data.max_seq_len)")
            if cfg.truncation == Truncation.drop:
                dropped.append(ex.id)
                continue
        kept.append((ex, n_prompt, ids))
    prompts = [tuple(ids[:n]) for _, n, ids in kept]
    if len(set(prompts)) < 2:
        raise ConfigError("data", f"{len(kept)} example(s) left to train on ({len(dropped)} longer than {m} tokens, "
                          f"{len(bad.where)} skipped as bad) with {len(set(prompts))} distinct prompt(s): the KL term "
                          "needs another prompt's completion for every example; accepted: at least two prompts")
    partner = kl_partners(prompts)
    seqs, masks, kl_cut = [], [], 0
    for (_, n_prompt, ids), j in zip(kept, partner):
        _, n_j, ids_j = kept[j]
        kl = ids[:n_prompt] + ids_j[n_j:]
        kl_cut += len(kl) > m
        for seq in (ids[:m], kl[:m]):
            seqs.append(np.asarray(seq, dtype=np.int32))
            masks.append(np.arange(len(seq)) >= n_prompt)
    lengths = np.array([len(t) for t in seqs], dtype=np.int64)
    flags = np.array([len(ids) > m for _, _, ids in kept], dtype=bool)
    labels = np.array([ex.label for ex, _, _ in kept], dtype=bool)
    stats = {"records_in": len(examples), "records_kept": len(kept), "pairs": len(kept),
             "desirable": int(labels.sum()), "undesirable": int((~labels).sum()),
             "truncation_policy": cfg.truncation.value, "max_seq_len": m, "dropped_too_long": len(dropped),
             "truncated": int(flags.sum()), "kl_truncated": kl_cut, "dropped_no_loss": 0,
             "dropped_ids": dropped[:100], "truncated_ids": [e.id for (e, _, _), t in zip(kept, flags) if t][:100],
             "loss_tokens": int(sum(int(mk.sum()) for mk in masks)), "tokens": int(lengths.sum())}
    return EncodedExamples(
        tokens=np.concatenate(seqs), loss_mask=np.concatenate(masks),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        ids=[f"{e.id}/{side}" for e, _, _ in kept for side in SIDES], roots=[e.root for e, _, _ in kept for _ in SIDES],
        source_index=np.repeat(np.asarray([e.source for e, _, _ in kept], dtype=np.int32), 2), stats=stats,
        truncated=flags, pair_ids=[e.id for e, _, _ in kept], labels=labels, kl_partner=partner)


def examples_fingerprint(data: EncodedExamples) -> str:
    """The pairs' fingerprint (tokens, masks, layout) with the labels and KL partners: a resume on the
    same tokens with other labels is other data."""
    if not data.meta.get("fingerprint"):
        h = hashlib.sha256(f"unpaired:{UNPAIRING_VERSION}:{pairs_fingerprint(data)}|".encode())
        h.update(np.ascontiguousarray(data.labels).tobytes() + np.ascontiguousarray(data.kl_partner).tobytes())
        data.meta["fingerprint"] = h.hexdigest()
    return data.meta["fingerprint"]


# ----------------------------------------------------------------------------------------- cache

_ARRAYS = ("truncated", "labels", "kl_partner")


def cache_parts(cfg: TrainConfig) -> dict[str, Any]:
    """The encode cache's key parts with the unpairing in the key: the same file read as pairs by
    objective=dpo is another entry."""
    parts = cache_key_parts(cfg.data, cfg.model)
    parts["pairing"] = {"version": PAIRING_VERSION, "unpaired": UNPAIRING_VERSION}
    keyed = ("sources", "tokenizer_sha256", "chat_template_sha256", "max_seq_len", "truncation", "on_bad_record",
             "max_records", "aux_sha256s", "libraries", "pairing")
    parts["key"] = encode_cache_key(**{k: parts[k] for k in keyed})
    return parts


def load_examples_encoded(cfg: TrainConfig, tokenizer) -> EncodedExamples:
    """The encoded examples of a run, from the encode cache when its key matches, else encoded and cached
    (as align.data.preference.load_pairs does for pairs)."""
    t0 = time.perf_counter()
    check_pair_sources(cfg.data)
    parts = cache_parts(cfg)
    key = parts["key"]
    check_chat_template(tokenizer, cfg.model, parts)
    entry = encode_dir(cfg.data) / key
    hit = cfg.data.cache and (entry / "meta.json").is_file()
    if hit:
        meta, arrays = _read_raw(entry, key, _ARRAYS)
        data = EncodedExamples(ids=meta["ids"], roots=meta["roots"], stats=meta["stats"], meta=dict(meta["content"]),
                               pair_ids=meta["pair_ids"], **arrays)
    else:
        bad = BadRecords(cfg.data.on_bad_record)
        formats: dict[str, Any] = {}
        data = encode_examples(load_examples(cfg.data, bad, formats), tokenizer, cfg.data, bad,
                               cfg.data.encode_workers)
        data.stats.update(bad.report())
        per_source = np.bincount(data.source_index[0::2], minlength=len(parts["sources"]))
        data.meta = {"encode_cache_key": key, "encode_version": ENCODE_VERSION,
                     "pairing_version": PAIRING_VERSION, "unpairing_version": UNPAIRING_VERSION, "fingerprint": None,
                     "records_per_source": [int(n) for n in per_source], "formats": formats,
                     **{k: parts[k] for k in ("tokenizer_sha256", "chat_template_sha256", "libraries")}}
        examples_fingerprint(data)
        if cfg.data.cache:
            _write_entry(entry, data, data.meta, _ARRAYS, ("pair_ids",))
    provenance(data, parts, entry, cfg.data.cache, hit, time.perf_counter() - t0)
    log.info("data: %d examples (%d desirable), %d tokens, encode cache %s (%s), %.2fs", data.pairs,
             int(data.labels.sum()), data.stats["tokens"], "hit" if hit else "miss", key[:12],
             data.meta["load_seconds"])
    return data
