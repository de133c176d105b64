"""Schemas of the data and sampler groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from align.config.rules import AUTO, _only, _read, _require, require_auto_resolved
from align.errors import ConfigError

# ------------------------------------------------------------------------------------------ data


class Source(StrEnum):
    gsm8k = "gsm8k"
    add = "add"
    """The bundled synthetic addition task (align/data/synthetic.py), split train or test."""
    mul = "mul"
    """The bundled multiplication task with its calculator demonstrations (align/data/synthetic.py), split
    train or test."""
    jsonl = "jsonl"
    parquet = "parquet"
    tokens = "tokens"
    preference = "preference"
    """A local JSONL file of preference records ({prompt, chosen, rejected}; align/data/preference.py)."""
    gsm8k_pairs = "gsm8k_pairs"
    """The bundled preference pairs derived from GSM8K train (align/data/assets/gsm8k_pairs)."""

    @property
    def bundled(self) -> bool:
        return self in (Source.gsm8k, Source.gsm8k_pairs, Source.add, Source.mul)

    @property
    def pairs(self) -> bool:
        """The source holds preference pairs (for a preference objective), not chat records."""
        return self in (Source.preference, Source.gsm8k_pairs)


class DataFormat(StrEnum):
    """The shape of a source's records (align/data/formats.py adapts each to a chat, a text or a pair)."""

    auto = "auto"
    messages = "messages"
    sharegpt = "sharegpt"
    alpaca = "alpaca"
    text = "text"
    prompt_completion = "prompt_completion"
    preference = "preference"

    @property
    def pairs(self) -> bool:
        return self == DataFormat.preference


class Truncation(StrEnum):
    drop = "drop"
    truncate = "truncate"
    fail = "fail"


class OnBadRecord(StrEnum):
    fail = "fail"
    skip = "skip"


@dataclass
class SourceConfig:
    """One source of a mixture (`data.mixture.<name>`). A null field inherits the same `data.*` field."""

    kind: Source = Source.jsonl
    """gsm8k: the bundled copy (`split`). jsonl/parquet: the local file `path`. tokens: a local JSONL
    file of pre-tokenized rows (`tokens_field`). preference: a local JSONL file of preference pairs;
    gsm8k_pairs: the bundled pairs (a mixture holds pairs only or chat records only)."""
    path: Optional[str] = None
    """Local file or directory of a file kind, read as `data.path` is."""
    split: str = "train"
    """Bundled split for kind=gsm8k, add or mul: train or test."""
    weight: float = 1.0
    """Epochs of this source per epoch of the mixture: 2.0 repeats every record twice, 0.5 draws a
    fresh random half each epoch (deterministic from seed and epoch)."""
    messages_field: Optional[str] = None
    """Chat field; null: `data.messages_field`."""
    prompt_field: Optional[str] = None
    """Prompt field; null: `data.prompt_field`."""
    response_field: Optional[str] = None
    """Response field; null: `data.response_field`."""
    root_field: Optional[str] = None
    """Root field; null: `data.root_field`."""
    id_field: Optional[str] = None
    """Id field; null: `data.id_field`."""
    tokens_field: Optional[str] = None
    """Token-id field of a tokens source; null: `data.tokens_field`."""
    format: Optional[DataFormat] = None
    """Record format of this source; null: `data.format`."""

    def check(self, key: str) -> None:
        _require(self.split in ("train", "test"), f"{key}.split", "must be one of: train, test", self.split)
        _require(self.weight > 0, f"{key}.weight", "must be > 0", self.weight)
        if not self.kind.bundled:
            _require(bool(self.path), f"{key}.path", f"is required when {key}.kind={self.kind.value}", self.path)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        kind = f"{key}.kind"
        return _read(
            {
                "path": _only(kind, self.kind, FILE_SOURCES),
                "split": _only(kind, self.kind, SPLIT_SOURCES),
                "tokens_field": _only(kind, self.kind, [Source.tokens]),
                "format": _only(kind, self.kind, FORMAT_SOURCES),
                **{f: _only(kind, self.kind, CHAT_SOURCES) for f in CHAT_FIELDS},
            }
        )


FILE_SOURCES = (Source.jsonl, Source.parquet, Source.tokens, Source.preference)
"""Sources read from a local file or directory (`path`)."""
CHAT_SOURCES = (Source.gsm8k, Source.jsonl, Source.parquet)
"""Sources whose records are chats (fields become messages; a tokens source has none)."""
CHAT_FIELDS = ("messages_field", "prompt_field", "response_field")
SPLIT_SOURCES = (Source.gsm8k, Source.add, Source.mul)
"""Bundled sources with a train and a test split (`split`)."""
FORMAT_SOURCES = (*CHAT_SOURCES, Source.add, Source.mul, Source.preference, Source.gsm8k_pairs)
"""Sources whose records have a format (`data.format`): all but pre-tokenized rows."""


def _check_format(key: str, fmt: DataFormat, kind: Source) -> None:
    """A pair format on a chat source, or a chat format on a pair source, can only fail record by record."""
    if fmt == DataFormat.auto or kind == Source.tokens or fmt.pairs == kind.pairs:
        return
    chats = ", ".join(f.value for f in DataFormat if not f.pairs)
    accepted = f"auto, {DataFormat.preference.value}" if kind.pairs else chats
    what = "preference pairs" if kind.pairs else "chat records (SFT, RL prompts)"
    raise ConfigError(key, f"{fmt.value} does not fit a {kind.value} source, which holds {what}; accepted: "
                           f"{accepted}", fmt.value)


@dataclass
class DataConfig:
    source: Source = Source.gsm8k
    """gsm8k: the copy bundled in the package. jsonl/parquet: a local file of chat records given by
    `path`, in any record format (`format`). tokens: a local JSONL file of pre-tokenized rows (no chat
    template; every token after the first is a target unless the row has a `loss_mask`). preference: a
    local file of preference pairs ({prompt, chosen, rejected}, or two chats sharing a prefix);
    gsm8k_pairs: the bundled pairs. add, mul: the bundled synthetic tasks (align/data/synthetic.py). Ignored
    when `mixture` is set."""
    path: Optional[str] = None
    """Local data file or directory of a file source. Its name sets how it is read: .jsonl (one JSON
    object per line), .json, .parquet, .arrow, or a `datasets` save_to_disk directory; another name
    is read as Parquet under `source=parquet`, else as JSON lines (docs/data.md#files)."""
    split: str = "train"
    """Bundled split (gsm8k, add, mul): train or test."""
    name: Optional[str] = None
    """Source name used in record ids and roots; null: `gsm8k`, or the file's stem."""
    messages_field: str = "messages"
    """Field holding a chat (list of {role, content}); used when present in a record."""
    prompt_field: str = "question"
    """Field holding the prompt when a record has no `messages_field`."""
    response_field: str = "answer"
    """Field holding the response when a record has no `messages_field`."""
    root_field: Optional[str] = None
    """Record field that splits a source into roots (root = `<source>/<field>=<value>`); null: the
    root is the source name. Bundled GSM8K derives `steps` (reasoning lines of the answer)."""
    id_field: Optional[str] = None
    """Record field holding a stable id (id = `<source>:<value>`); null: `<source>:<line number>`."""
    tokens_field: str = "input_ids"
    """Field holding the token ids of a row of a `tokens` source (an optional `loss_mask` field of 0/1
    per token marks the targets; position 0 is never a target)."""
    format: DataFormat = DataFormat.auto
    """Record format (docs/data.md#record-formats). auto: detected from the records of each source, and
    refused when a record fits two formats or the records mix formats. messages: `messages_field`, a
    list of {role, content}; sharegpt: `conversations`, a list of {from, value}; alpaca: instruction,
    optional input (appended to the instruction), output; text: `text`, every token trained, no chat
    template; prompt_completion: `prompt_field` and `response_field`, or prompt and completion, each a
    string or a chat; preference: prompt, chosen, rejected, or two chats chosen/rejected sharing a
    prefix (preference sources only). Named, records that do not fit it are bad records."""
    mixture: dict[str, SourceConfig] = field(default_factory=dict)
    """Several sources by name, each with a weight; when set, `source`/`path`/`split` are unused."""
    mask_files: list[str] = field(default_factory=list)
    """Auxiliary loss-mask files (JSONL lines {"id": <record id>, "turns": [message indices]}):
    the named assistant turns get no loss. OR-merged with the prompt mask and with each other."""
    max_seq_len: int = 512
    """Longest encoded record in tokens (prompt + response + EOS)."""
    truncation: Truncation = Truncation.drop
    """A record longer than `max_seq_len`: drop it, truncate it from the right, or fail (exit 2)."""
    on_bad_record: OnBadRecord = OnBadRecord.fail
    """A malformed line or a record without the configured fields: fail (exit 2, naming file:line)
    or skip it (counted in the data report)."""
    max_records: Optional[int] = None
    """Use only the first N records of each source (null: all)."""
    cache: bool = True
    """Reuse encodings from `cache_dir`, keyed on everything that can change what they mean."""
    cache_dir: Optional[str] = None
    """Encode cache directory, one sub-directory per key; null: `encode/` in align's cache directory
    ($ALIGN_CACHE_DIR, else $XDG_CACHE_HOME/align, else ~/.cache/align)."""
    encode_workers: Optional[int] = None
    """Worker processes that encode; 0 encodes in-process; null: in-process under 2,000 records,
    else one per available core (at most 8)."""

    def __post_init__(self) -> None:
        _require(self.max_seq_len >= 8, "data.max_seq_len", "must be >= 8", self.max_seq_len)
        _require(self.split in ("train", "test"), "data.split", "must be one of: train, test", self.split)
        if not self.source.bundled and not self.mixture:
            _require(bool(self.path), "data.path", f"is required when data.source={self.source.value}", self.path)
        if self.max_records is not None:
            _require(self.max_records >= 1, "data.max_records", "must be >= 1 or null", self.max_records)
        if self.encode_workers is not None:
            _require(self.encode_workers >= 0, "data.encode_workers", "must be >= 0 or null", self.encode_workers)
        for name, src in self.mixture.items():
            src.check(f"data.mixture.{name}")
        if not self.mixture:
            _check_format("data.format", self.format, self.source)
        for name, src in self.mixture.items():
            own = src.format is not None
            _check_format(f"data.mixture.{name}.format" if own else "data.format", src.format if own else self.format,
                          src.kind)
        kinds = {n: s.kind.pairs for n, s in self.mixture.items()}
        _require(
            len(set(kinds.values())) <= 1,
            "data.mixture",
            "mixes preference pairs with chat records; accepted: only pair kinds (preference, gsm8k_pairs) "
            "or only chat kinds",
            {n: s.kind.value for n, s in self.mixture.items()},
        )

    @property
    def holds_pairs(self) -> bool:
        """The sources are preference pairs (a preference objective's data), not chat records."""
        return next(iter(self.mixture.values())).kind.pairs if self.mixture else self.source.pairs

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        out = {} if self.cache else {"cache_dir": f"ignored when {key}.cache=false"}
        if not self.mixture:
            return {
                **out,
                **_read(
                    {
                        "path": _only(key, self.source, FILE_SOURCES),
                        "split": _only(key, self.source, SPLIT_SOURCES),
                        "tokens_field": _only(key, self.source, [Source.tokens]),
                        "format": _only(key, self.source, FORMAT_SOURCES),
                        **{f: _only(key, self.source, CHAT_SOURCES) for f in CHAT_FIELDS},
                    }
                ),
            }
        mix = f"ignored when {key}.mixture is set: each {key}.mixture.<name> has its own"
        out.update({f: mix for f in ("source", "path", "split", "name")})
        # A mixture source inherits a null field from data.*: data.<field> is read when one does.
        inherit = {"tokens_field": [Source.tokens], "format": FORMAT_SOURCES,
                   **{f: CHAT_SOURCES for f in CHAT_FIELDS}}
        for f, kinds in inherit.items():
            if not any(s.kind in kinds and getattr(s, f) is None for s in self.mixture.values()):
                out[f] = (
                    f"ignored: no source of {key}.mixture with kind {' or '.join(k.value for k in kinds)} "
                    f"leaves its own {f} null to inherit it"
                )
        return out


# --------------------------------------------------------------------------------------- sampler


class SamplerKind(StrEnum):
    shuffle = "shuffle"
    bucket = "bucket"
    budget = "budget"


def _budget(key: str, value: Any) -> Any:
    """A token budget: an int >= 1, null, or "auto" kept for the trainer to resolve where the device
    is known (align.plan.budget_auto.plan_budget)."""
    if value is None or value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigError(key, "must be an int >= 1, auto or null", value)


def require_resolved(value: Any, where: str) -> None:
    """An unresolved `sampler.max_tokens=auto` must not reach a sampler or an estimate, which read a number."""
    require_auto_resolved("sampler.max_tokens", value, where, "align.plan.budget_auto.plan_budget")


@dataclass
class SamplerConfig:
    kind: SamplerKind = SamplerKind.shuffle
    """shuffle: random micro-batches. bucket: sort by length within buckets of `bucket_size`
    records, cut micro-batches of neighbours, then shuffle the micro-batches globally. budget: as
    bucket, but each micro-batch takes as many rows as fit in `max_tokens`. conf/train.yaml picks budget
    (conf/sampler/budget.yaml); objective=grpo picks shuffle."""
    micro_batch_size: int = 8
    """Rows per micro-batch (shuffle, bucket; ignored by budget)."""
    bucket_size: int = 64
    """Records per length bucket (bucket, budget). A bucket as large as the data is a full sort; one no
    larger than `micro_batch_size` pairs nothing (micro-batches keep `micro_batch_size` rows)."""
    max_tokens: Any = None
    """Token budget of a micro-batch (budget sampler): rows x padded length <= max_tokens (packed:
    the sum of the padded row lengths). Must hold the longest record. auto (the default of
    sampler=budget): resolved where the device is known (align/plan/budget_auto.py): on a CPU 4096
    tokens; on CUDA the largest of 4096 x k (k = 1..8) whose training-memory estimate (with the
    resolved `trainer.loss_chunk_tokens`) is at most 0.85 of the device's memory for compiled blocks,
    0.75 for eager ones; never below the longest record (`data.max_seq_len` rounded up to
    `pad_to_multiple_of`). The manifest's `sampler_budget` says what it resolved to and why."""
    pad_to_multiple_of: int = 1
    """Round each micro-batch's padded length up to a multiple of this (bounds the set of shapes)."""
    mask_padding: bool = True
    """Give right-padded micro-batches an attention mask. false: no mask: in a causal decoder a real
    token attends only to positions at its left, all real, so real-token logits are unchanged (tested
    per family and backend) and SDPA keeps its is_causal fast path; MoE router statistics and losses
    still leave padding out. Padding costs compute either way (see padding waste)."""
    packed: bool = False
    """Concatenate a micro-batch's rows into one padding-free row with restarting `position_ids`
    (no attention mask, `use_cache=False`; documents never attend to each other)."""

    def __post_init__(self) -> None:
        _require(self.micro_batch_size >= 1, "sampler.micro_batch_size", "must be >= 1", self.micro_batch_size)
        _require(self.bucket_size >= 1, "sampler.bucket_size", "must be >= 1", self.bucket_size)
        _require(self.pad_to_multiple_of >= 1, "sampler.pad_to_multiple_of", "must be >= 1", self.pad_to_multiple_of)
        if self.kind == SamplerKind.budget:
            _require(self.max_tokens is not None, "sampler.max_tokens", "is required when sampler.kind=budget")
        self.max_tokens = _budget("sampler.max_tokens", self.max_tokens)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`). `micro_batch_size` under
        budget is TrainConfig's call: the probes read it whatever the sampler."""
        return _read(
            {
                "bucket_size": _only(key, self.kind, [SamplerKind.bucket, SamplerKind.budget]),
                "max_tokens": _only(key, self.kind, [SamplerKind.budget]),
                # mask_padding under packed is not refused: the default budget option sets it false
                # (what a packed row is anyway), and a packed row has no padding to mask either way.
            }
        )
