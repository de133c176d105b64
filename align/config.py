"""Typed configuration: one dataclass per config group, registered in Hydra's ConfigStore.

`conf/train.yaml` composes the groups onto the `train_schema` node below, so every YAML value is
type-checked by omegaconf when Hydra composes, and `to_typed()` (the one seam from config to
objects: `OmegaConf.to_object`) runs each `__post_init__` for value checks. Choices are `Enum`s
(omegaconf rejects `typing.Literal`, LANDMINES 12). Every field carries a docstring; the
configuration reference in docs/configuration.md is generated from these.

`to_typed` also refuses, for every schema at once: a key the schema does not declare (omegaconf
lets `+group.key=value` add one to a typed node), a non-finite float anywhere, and a key set to
anything but its default while the composed option does not read it (each schema's `ignored()`
says which of its fields the current choice leaves unread, and who reads them).

Values are checked here; kwargs NAMES are checked against the installed libraries in
`align.preflight`. A `ConfigError` names the dotted key and what is accepted, and becomes exit 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Iterable, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from align.errors import ConfigError


def _choices(enum: type[StrEnum]) -> str:
    return ", ".join(e.value for e in enum)


def _require(cond: bool, key: str, msg: str, value: Any = None) -> None:
    if not cond:
        raise ConfigError(key, msg, value)


def _opt(label: str, value: Any) -> str:
    return f"{label}={_plain(value)}"


def _only(label: str, current: Any, readers: Iterable[Any]) -> Optional[str]:
    """None when the choice `current` reads the field, else why it is ignored. `label` is a group
    (its options are named after their choice: tests/config/test_compose.py holds them to it) or a key."""
    readers = list(readers)
    if current in readers:
        return None
    if "." in label:
        values = " or ".join(str(_plain(r)) for r in readers)
        return f"ignored by {_opt(label, current)}; it is read when {label} is {values}"
    return f"ignored by {_opt(label, current)}; it is read by {', '.join(_opt(label, r) for r in readers)}"


def _plain(value: Any) -> Any:
    """An enum as the string the user typed (also inside lists), for messages."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return getattr(value, "value", value)


def _read(rules: dict[str, Optional[str]]) -> dict[str, str]:
    return {k: why for k, why in rules.items() if why}


# ----------------------------------------------------------------------------------------- model


class Family(StrEnum):
    mistral = "mistral"
    olmoe = "olmoe"
    gemma4 = "gemma4"
    """Gemma-4 text model, dense MLP (presets: tiny, small, full = gemma-4-31B)."""
    gemma4_moe = "gemma4_moe"
    """Gemma-4 text model with its MoE block (enable_moe_block; full = gemma-4-26B-A4B)."""


class Preset(StrEnum):
    tiny = "tiny"
    small = "small"
    full = "full"


class ExpertsImpl(StrEnum):
    eager = "eager"
    batched_mm = "batched_mm"
    grouped_mm = "grouped_mm"


@dataclass
class MoEConfig:
    experts: Optional[ExpertsImpl] = None
    """Requested MoE experts kernel (transformers' `experts_implementation`); null keeps the
    library default. The resolved one is read back from `config._experts_implementation`."""
    lb_weight: float = 0.0
    """Load-balancing loss weight added to the training loss; 0 computes and logs it but does not
    apply it. What was applied is recorded in the manifest (LANDMINES 5)."""
    z_weight: float = 0.0
    """Router z-loss weight added to the training loss; 0 computes and logs it but does not apply it."""
    telemetry: bool = True
    """Router telemetry per MoE layer at every optimizer step (load, MaxVio, utilization, dead
    experts, entropy, lb/z values) into history, W&B `moe/l{i}/...` and plots/moe_expert_load.png."""

    def __post_init__(self) -> None:
        _require(self.lb_weight >= 0, "model.moe.lb_weight", "must be >= 0", self.lb_weight)
        _require(self.z_weight >= 0, "model.moe.z_weight", "must be >= 0", self.z_weight)


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train LoRA adapters (peft) instead of the full model."""
    r: int = 16
    """LoRA rank."""
    alpha: float = 32.0
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""
    gate_steps: int = 10
    """After this many optimizer steps every `lora_B` must have moved from zero, else the run halts
    (the inert-adapter gate). 0 disables the gate (recorded in the manifest)."""
    qlora: bool = False
    """Quantize the frozen base to 4-bit NF4 with bitsandbytes while loading (QLoRA). Dense families
    only (fused 3-D expert weights are not nn.Linear, so bitsandbytes would leave them full size);
    needs `model.pretrained` (quantizing random weights measures nothing)."""

    def __post_init__(self) -> None:
        _require(self.r >= 1, "model.lora.r", "must be >= 1", self.r)
        _require(self.alpha > 0, "model.lora.alpha", "must be > 0", self.alpha)
        _require(0 <= self.dropout < 1, "model.lora.dropout", "must be in [0, 1)", self.dropout)
        _require(self.gate_steps >= 0, "model.lora.gate_steps", "must be >= 0 (0 disables the gate)", self.gate_steps)
        _require(self.enabled or not self.qlora, "model.lora.qlora", "needs model.lora.enabled=true", self.qlora)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        if self.enabled:
            return {}
        return {f.name: f"ignored unless {key}.enabled=true" for f in dataclasses.fields(self) if f.name != "enabled"}


@dataclass
class ModelConfig:
    family: Family = Family.mistral
    """Model family: the transformers class that is built (no align model code)."""
    preset: Preset = Preset.tiny
    """Size preset when building from config with random init: tiny (CPU tests), small, full."""
    pretrained: Optional[str] = None
    """A local HF checkpoint directory (config.json, safetensors, tokenizer). Its tokenizer and chat
    template are used. Null builds `preset` with random init and the bundled tokenizer."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Model-config fields that replace the preset's (names checked against the config class)."""
    init_on_device: bool = False
    """Create random-init weights directly on the CUDA device (single and fsdp; a 7B model's host init
    costs a minute and its fp32 size in host RAM). Off by default: CUDA and host RNG streams differ,
    so runs that must start from identical weights (parity across parallel layouts) keep it off."""
    dtype: Optional[str] = None
    """Parameter dtype (float32, bfloat16); null: float32 (bf16 autocast does the compute on GPU)."""
    moe: MoEConfig = field(default_factory=MoEConfig)
    """MoE options; ignored by dense families."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA options."""
    allow_over_memory: bool = False
    """Start even when preflight's training-memory estimate exceeds the memory of the visible device."""

    def __post_init__(self) -> None:
        _require(
            self.dtype in (None, "float32", "bfloat16", "float16"),
            "model.dtype",
            "must be one of: float32, bfloat16, float16 (or null)",
            self.dtype,
        )

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`). `moe` on a dense model is
        refused by preflight (align.models.build.check_router_losses): only the built config says
        whether a checkpoint has a router."""
        if not self.pretrained:
            return {}
        return {"preset": f"ignored when {key}.pretrained is set (the checkpoint's config.json gives the shape)",
                "init_on_device": f"ignored when {key}.pretrained is set (it places random-init weights)"}


# ------------------------------------------------------------------------------------- attention


class AttnImpl(StrEnum):
    sdpa = "sdpa"
    eager = "eager"
    flex = "flex"
    flash = "flash"

    @property
    def hf_name(self) -> str:
        """The `attn_implementation` string transformers expects."""
        return {"sdpa": "sdpa", "eager": "eager", "flex": "flex_attention", "flash": "flash_attention_2"}[self.value]


class Fallback(StrEnum):
    refuse = "refuse"
    allow = "allow"


class SdpaKernel(StrEnum):
    flash = "flash"
    cudnn = "cudnn"
    efficient = "efficient"
    math = "math"

    @property
    def torch_name(self) -> str:
        """The `torch.nn.attention.SDPBackend` member."""
        return {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                "math": "MATH"}[self.value]


@dataclass
class AttentionConfig:
    implementation: AttnImpl = AttnImpl.sdpa
    """Requested attention backend. The resolved one (`config._attn_implementation`) is recorded."""
    fallback: Fallback = Fallback.refuse
    """refuse: a backend the family or machine cannot run fails preflight. allow: fall back to the
    library's choice, log it loudly and record both."""
    sdpa_kernels: list[SdpaKernel] = field(
        default_factory=lambda: [SdpaKernel.flash, SdpaKernel.efficient, SdpaKernel.cudnn, SdpaKernel.math])
    """With implementation=sdpa: the kernels torch may pick, in priority order, applied around every
    forward; the first that supports the call runs. Flash first because on the H200 torch's own order
    (`[]`) picks cuDNN, which builds a plan per new shape: with ragged batches flash-first trained
    4-6% (dense) and 18% (OLMoE) faster (H200, 2026-11-30, docs/performance.md). The kernel that
    ran is recorded from the profiler on GPU."""

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        return _read({"sdpa_kernels": _only(key, self.implementation, [AttnImpl.sdpa])})


# ------------------------------------------------------------------------------------------ data


class Source(StrEnum):
    gsm8k = "gsm8k"
    jsonl = "jsonl"
    parquet = "parquet"
    tokens = "tokens"
    preference = "preference"
    """A local JSONL file of preference records ({prompt, chosen, rejected}; align/data/preference.py)."""
    gsm8k_pairs = "gsm8k_pairs"
    """The bundled preference pairs derived from GSM8K train (align/data/assets/gsm8k_pairs)."""

    @property
    def bundled(self) -> bool:
        return self in (Source.gsm8k, Source.gsm8k_pairs)

    @property
    def pairs(self) -> bool:
        """The source holds preference pairs (for a preference objective), not chat records."""
        return self in (Source.preference, Source.gsm8k_pairs)


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
    """Local file for kind=jsonl or kind=parquet."""
    split: str = "train"
    """Bundled GSM8K split for kind=gsm8k: train or test."""
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

    def check(self, key: str) -> None:
        _require(self.split in ("train", "test"), f"{key}.split", "must be one of: train, test", self.split)
        _require(self.weight > 0, f"{key}.weight", "must be > 0", self.weight)
        if not self.kind.bundled:
            _require(bool(self.path), f"{key}.path", f"is required when {key}.kind={self.kind.value}", self.path)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        kind = f"{key}.kind"
        return _read({"path": _only(kind, self.kind, FILE_SOURCES), "split": _only(kind, self.kind, [Source.gsm8k]),
                      "tokens_field": _only(kind, self.kind, [Source.tokens]),
                      **{f: _only(kind, self.kind, CHAT_SOURCES) for f in CHAT_FIELDS}})


FILE_SOURCES = (Source.jsonl, Source.parquet, Source.tokens, Source.preference)
"""Sources read from a local file (`path`)."""
CHAT_SOURCES = (Source.gsm8k, Source.jsonl, Source.parquet)
"""Sources whose records are chats (fields become messages; a tokens source has none)."""
CHAT_FIELDS = ("messages_field", "prompt_field", "response_field")


@dataclass
class DataConfig:
    source: Source = Source.gsm8k
    """gsm8k: the copy bundled in the package. jsonl/parquet: a local file given by `path`. tokens:
    a local JSONL file of pre-tokenized rows (no chat template; every token after the first is a
    target unless the row has a `loss_mask`). preference: a local JSONL file of preference pairs
    ({prompt, chosen, rejected}, or two chats sharing a prefix); gsm8k_pairs: the bundled pairs.
    Ignored when `mixture` is set."""
    path: Optional[str] = None
    """Local data file for `source=jsonl` (one JSON object per line) or `source=parquet`."""
    split: str = "train"
    """Bundled GSM8K split: train or test."""
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
    cache_dir: str = ".cache/align/encode"
    """Encode cache directory (relative to the working directory); one sub-directory per key."""
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
        kinds = {n: s.kind.pairs for n, s in self.mixture.items()}
        _require(len(set(kinds.values())) <= 1, "data.mixture",
                 "mixes preference pairs with chat records; accepted: only pair kinds (preference, gsm8k_pairs) "
                 "or only chat kinds", {n: s.kind.value for n, s in self.mixture.items()})

    @property
    def holds_pairs(self) -> bool:
        """The sources are preference pairs (a preference objective's data), not chat records."""
        return next(iter(self.mixture.values())).kind.pairs if self.mixture else self.source.pairs

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        out = {} if self.cache else {"cache_dir": f"ignored when {key}.cache=false"}
        if not self.mixture:
            return {**out, **_read({
                "path": _only(key, self.source, FILE_SOURCES), "split": _only(key, self.source, [Source.gsm8k]),
                "tokens_field": _only(key, self.source, [Source.tokens]),
                **{f: _only(key, self.source, CHAT_SOURCES) for f in CHAT_FIELDS}})}
        mix = f"ignored when {key}.mixture is set: each {key}.mixture.<name> has its own"
        out.update({f: mix for f in ("source", "path", "split", "name")})
        # A mixture source inherits a null field from data.*: data.<field> is read when one does.
        inherit = {"tokens_field": [Source.tokens], **{f: CHAT_SOURCES for f in CHAT_FIELDS}}
        for f, kinds in inherit.items():
            if not any(s.kind in kinds and getattr(s, f) is None for s in self.mixture.values()):
                out[f] = (f"ignored: no source of {key}.mixture with kind {' or '.join(k.value for k in kinds)} "
                          f"leaves its own {f} null to inherit it")
        return out


# --------------------------------------------------------------------------------------- sampler


class SamplerKind(StrEnum):
    shuffle = "shuffle"
    bucket = "bucket"
    budget = "budget"


@dataclass
class SamplerConfig:
    kind: SamplerKind = SamplerKind.shuffle
    """shuffle: random micro-batches. bucket: sort by length within buckets of `bucket_size`
    records, cut micro-batches of neighbours, then shuffle the micro-batches globally. budget: as
    bucket, but each micro-batch takes as many rows as fit in `max_tokens`."""
    micro_batch_size: int = 8
    """Rows per micro-batch (shuffle, bucket; ignored by budget)."""
    bucket_size: int = 64
    """Records per length bucket (bucket, budget). A bucket as large as the data is a full sort; one no
    larger than `micro_batch_size` pairs nothing (micro-batches keep `micro_batch_size` rows)."""
    max_tokens: Optional[int] = None
    """Token budget of a micro-batch (budget sampler): rows x padded length <= max_tokens (packed:
    the sum of the padded row lengths). Must hold the longest record."""
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
        if self.max_tokens is not None:
            _require(self.max_tokens >= 1, "sampler.max_tokens", "must be >= 1 or null", self.max_tokens)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`). `micro_batch_size` under
        budget is TrainConfig's call: the probes read it whatever the sampler."""
        return _read({"bucket_size": _only(key, self.kind, [SamplerKind.bucket, SamplerKind.budget]),
                      "max_tokens": _only(key, self.kind, [SamplerKind.budget]),
                      "mask_padding": f"ignored when {key}.packed=true (a packed row has no padding)" if self.packed
                      else None})


# ------------------------------------------------------------------------------------- optimizer


class OptimizerName(StrEnum):
    adamw = "adamw"
    adamw8bit = "adamw8bit"


@dataclass
class OptimizerConfig:
    name: OptimizerName = OptimizerName.adamw
    """adamw: torch.optim.AdamW (fused on CUDA). adamw8bit: 8-bit AdamW, bitsandbytes on plain
    tensors when installed (else torchao), torchao under parallel=fsdp/ep (bitsandbytes fails on
    DTensor parameters); the one that ran is recorded as `optimizer_impl`."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay (>= 0)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam betas: two decay rates, each in [0, 1)."""
    eps: float = 1e-8
    """Adam epsilon (> 0: with 0, a parameter whose gradient stays zero divides 0 by 0)."""
    warmup_ratio: float = 0.05
    """Warm-up as a fraction of `trainer.max_steps`; converted to steps at the scheduler call site,
    so it survives a change of run length (playbook 4.2)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; <= 0 disables clipping (the norm is still logged)."""
    compile: bool = False
    """torch.compile torch's own AdamW step (foreach, capturable; the learning rate is handed in as a
    device tensor so a schedule does not recompile, and the clip scale is applied inside the compiled
    step) instead of the fused kernel. At OLMoE-1B-7B's shapes on an H200 (2026-11-30) the compiled
    update streams at 3.9 TB/s against fused AdamW's 2.3 TB/s: 25.0 vs 41.9 ms per step. The first
    step compiles (~40 s there). CUDA and optimizer=adamw only; on a CPU it resolves to off and the
    manifest's `optimizer_step` says why. A non-finite step is then skipped by the host. With
    `optimizer.overlap` each chunk steps through the compiled update (kind overlap+compiled; dynamo's
    recompile limit is raised to two graphs per chunk and recorded as `recompile_limit`)."""
    overlap: bool = False
    """Run each step's optimizer on a side CUDA stream, decoder block by block, while the next
    forward waits for a block's parameters only when it reaches that block (align.optim.step).
    Bit-identical to the plain step. parallel=single and eager blocks only; on a CPU it resolves
    to off, and the manifest's `optimizer_step` says why. Combines with `optimizer.compile`."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optimizer.lr", "must be > 0", self.lr)
        _require(0 <= self.warmup_ratio < 1, "optimizer.warmup_ratio", "must be in [0, 1)", self.warmup_ratio)
        _require(len(self.betas) == 2, "optimizer.betas", "must be a list of two floats", self.betas)
        # torch's AdamW checks these only when the optimizer is built, after the tokenizer, the encode and the model.
        _require(all(0 <= b < 1 for b in self.betas), "optimizer.betas", "each beta must be in [0, 1)", self.betas)
        _require(self.eps > 0, "optimizer.eps", "must be > 0", self.eps)
        _require(self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", self.weight_decay)


# -------------------------------------------------------------------------------------- parallel


class ParallelKind(StrEnum):
    single = "single"
    fsdp = "fsdp"
    ep = "ep"


class ParamDtype(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


@dataclass
class ParallelConfig:
    kind: ParallelKind = ParallelKind.single
    """single: one process, one device. fsdp: FSDP2 `fully_shard` per decoder block and at the root
    over every rank (launch with launchers/torchrun.sh). ep: experts sharded on dim 0 over an EP mesh
    dimension with tokens exchanged by all-to-all (transformers' expert parallel), dense parameters
    under FSDP2; MoE families only."""
    activation_checkpointing: bool = False
    """Recompute each decoder block in backward (transformers' activation checkpointing)."""
    activation_checkpointing_fraction: float = 1.0
    """With `activation_checkpointing`: the fraction f (0 < f <= 1) of the L decoder blocks to
    recompute; the others keep their activations (faster, more memory). k = max(1, floor(f*L + 0.5))
    blocks, spread evenly over depth: indices floor(i*L/k) for i < k (f=0.5, L=16: 0, 2, ..., 14).
    The manifest records the indices: model.extra.parallel.activation_checkpointing_blocks."""
    param_dtype: ParamDtype = ParamDtype.auto
    """Dtype FSDP2 gathers parameters in for compute (MixedPrecisionPolicy); gradients are always
    reduced in float32. auto: bfloat16 on CUDA, float32 on CPU."""
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (re-gather in backward): less memory,
    one more all-gather per block."""
    ep_size: Optional[int] = None
    """Ranks that hold distinct experts (parallel=ep); null: all ranks. Must divide the world size
    and the number of experts; the remaining factor shards each expert with FSDP."""
    pg_timeout_s: int = 600
    """Process-group timeout: a collective that waits longer fails (with a flight-recorder dump on
    NCCL when `flight_recorder_entries` > 0) instead of hanging the job."""
    flight_recorder_entries: int = 2000
    """NCCL flight recorder ring size (TORCH_FR_BUFFER_SIZE); 0 disables it. On a collective
    timeout each rank dumps its recent collectives under <run_dir>/rank<r>/flight_recorder/."""

    def __post_init__(self) -> None:
        if self.ep_size is not None:
            _require(self.ep_size >= 1, "parallel.ep_size", "must be >= 1 or null", self.ep_size)
        _require(0 < self.activation_checkpointing_fraction <= 1, "parallel.activation_checkpointing_fraction",
                 "must be in (0, 1]: the fraction of decoder blocks to recompute", self.activation_checkpointing_fraction)
        _require(self.activation_checkpointing or self.activation_checkpointing_fraction == 1,
                 "parallel.activation_checkpointing_fraction",
                 "has no effect unless parallel.activation_checkpointing=true; set both, or leave the fraction at 1.0",
                 self.activation_checkpointing_fraction)
        _require(self.pg_timeout_s >= 1, "parallel.pg_timeout_s", "must be >= 1", self.pg_timeout_s)
        _require(self.flight_recorder_entries >= 0, "parallel.flight_recorder_entries", "must be >= 0",
                 self.flight_recorder_entries)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        sharded = [ParallelKind.fsdp, ParallelKind.ep]
        return _read({"ep_size": _only(key, self.kind, [ParallelKind.ep]),
                      "param_dtype": _only(key, self.kind, sharded),
                      "reshard_after_forward": _only(key, self.kind, [ParallelKind.fsdp]),
                      "pg_timeout_s": _only(key, self.kind, sharded),
                      "flight_recorder_entries": _only(key, self.kind, sharded)})


# ---------------------------------------------------------------------------------------- logger


class LoggerKind(StrEnum):
    wandb = "wandb"
    none = "none"


class WandbMode(StrEnum):
    offline = "offline"
    online = "online"


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.wandb
    """wandb: log to Weights & Biases on rank 0. none: history.jsonl only."""
    mode: WandbMode = WandbMode.offline
    """offline writes the run under the run dir with no network; online syncs."""
    project: str = "align"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (team or user); null: the default of the logged-in user."""
    tags: list[str] = field(default_factory=list)
    """W&B tags."""
    log_model: bool = False
    """Log the exported model (`<run_dir>/export`, needs trainer.export=true) as a W&B model artifact
    `run-<id>-model` (aliases latest, step-<n>) when the run completes. Off: exports stay local."""

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        return _read({f: _only(key, self.kind, [LoggerKind.wandb]) for f in ("mode", "project", "entity", "tags")})


# --------------------------------------------------------------------------------------- trainer


class Precision(StrEnum):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ResumePolicy(StrEnum):
    auto = "auto"
    never = "never"
    must = "must"


@dataclass
class TrainerConfig:
    max_steps: int = 150
    """Optimizer steps to run."""
    grad_accum: int = 1
    """Micro-batches per optimizer step. The loss is averaged per loss token over the whole window."""
    seed: int = 0
    """Seed for model init, sampling and dropout."""
    deterministic: bool = False
    """`torch.use_deterministic_algorithms(True)` (slower; needed for bit-exact reruns on GPU)."""
    precision: Precision = Precision.auto
    """auto: bf16 autocast on CUDA, fp32 on CPU."""
    device: Device = Device.auto
    """auto: CUDA when available, else CPU."""
    cuda_alloc_conf: Optional[str] = None
    """PYTORCH_CUDA_ALLOC_CONF for this run when the environment sets none, e.g.
    `expandable_segments:True` (ragged shapes fragment fixed segments; each allocator retry frees the
    cache and synchronises). Applied before CUDA starts; the value in force is recorded. null: as is."""
    log_every: int = 10
    """Console log line every N optimizer steps when stderr is not a TTY (history gets every step)."""
    export: bool = True
    """Write the trained model in HF layout (safetensors, config, tokenizer) to `export/` at the end."""
    save_every: int = 0
    """Write a checkpoint (torch.distributed.checkpoint) every N optimizer steps; 0: only at a
    coordinated stop. A checkpoint counts only when complete (see docs/distributed.md)."""
    keep_last: int = 2
    """Complete checkpoints kept on disk (older ones are deleted, including those a previous attempt
    of this run left); 0 keeps all."""
    resume: ResumePolicy = ResumePolicy.auto
    """auto: resume from the newest complete checkpoint under <run_dir>/checkpoints when there is
    one. never: start fresh (existing checkpoints are left alone). must: refuse to start without one."""
    resume_from: Optional[str] = None
    """An explicit checkpoint directory to resume from (overrides the automatic pick)."""
    resume_despite_mismatch: bool = False
    """Resume even though world size, dataset fingerprint, sampler or model shape differ from the
    checkpoint's (refused by default, with the reason)."""
    compile: bool = False
    """torch.compile each decoder block. On an H200 (2026-11-30) it made the whole step 1.42x faster
    for OLMoE-1B-7B and 1.45x for the dense bench model (docs/performance.md). The first steps
    compile (OLMoE there: ~80 s cold with optimizer.compile; inductor's disk cache shortens reruns).
    Recompiles, graph breaks and recompile-limit hits are in the manifest's dynamo counters."""
    compile_dynamic: Optional[bool] = True
    """torch.compile's `dynamic` for the blocks under trainer.compile. true: one graph with symbolic
    batch and sequence sizes from the first call (a one-row batch adds one more); on an H200
    (2026-11-30) it ran OLMoE's blocks as fast as a graph compiled for one fixed shape. null: a block
    compiles for the first shape and turns dynamic at its first recompile. false: a graph per shape
    (bound the shapes with sampler.pad_to_multiple_of). Past dynamo's recompile limit (8) a block runs
    eager, which only the manifest's dynamo counters show."""
    loss_chunk_tokens: int = 0
    """> 0: compute the LM head and cross-entropy over this many target tokens at a time (recomputed
    in backward), so logits memory stays bounded for large vocabularies; 0: all logits at once."""
    max_consecutive_skipped_steps: int = 3
    """Optimizer steps with a non-finite loss or gradient norm (on any rank) are skipped on all
    ranks; more than this many in a row halt the run (exit 81, HALT.json)."""

    def __post_init__(self) -> None:
        _require(self.max_steps >= 1, "trainer.max_steps", "must be >= 1", self.max_steps)
        _require(self.save_every >= 0, "trainer.save_every", "must be >= 0", self.save_every)
        _require(self.keep_last >= 0, "trainer.keep_last", "must be >= 0", self.keep_last)
        _require(self.max_consecutive_skipped_steps >= 0, "trainer.max_consecutive_skipped_steps", "must be >= 0",
                 self.max_consecutive_skipped_steps)
        _require(self.grad_accum >= 1, "trainer.grad_accum", "must be >= 1", self.grad_accum)
        _require(self.log_every >= 1, "trainer.log_every", "must be >= 1", self.log_every)
        _require(self.loss_chunk_tokens >= 0, "trainer.loss_chunk_tokens", "must be >= 0", self.loss_chunk_tokens)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        return {} if self.compile else {"compile_dynamic": f"ignored unless {key}.compile=true"}


# ------------------------------------------------------------------------------------- objective


class ObjectiveKind(StrEnum):
    sft = "sft"
    dpo = "dpo"


class ReferenceKind(StrEnum):
    auto = "auto"
    model = "model"
    adapters_off = "adapters_off"
    precomputed = "precomputed"
    none = "none"


class ReferenceDtype(StrEnum):
    same = "same"
    bf16 = "bf16"
    fp32 = "fp32"


@dataclass
class ObjectiveConfig:
    """What the run optimises (the `objective` group); align/objectives/base.py is the seam. Keys
    after `kind` belong to dpo (align/objectives/dpo.py); under sft they must stay at their defaults."""

    kind: ObjectiveKind = ObjectiveKind.sft
    """sft: cross-entropy on the loss-masked tokens (chat: the assistant turns), averaged per loss
    token over the accumulation window on all ranks. dpo: a preference loss on pairs (`loss`)."""
    loss: str = "sigmoid"
    """dpo: sigmoid (DPO), ipo, hinge, robust, conservative (label-smoothed sigmoid), simpo and orpo
    (both reference-free); definitions in align/objectives/preference_losses.py."""
    beta: float = 0.1
    """dpo: the loss's beta (for orpo, the weight of the odds-ratio term: the paper's lambda)."""
    label_smoothing: float = 0.0
    """dpo, robust and conservative only: the assumed label-flip rate, in [0, 0.5)."""
    simpo_gamma: float = 0.0
    """dpo, simpo only: the target reward margin."""
    reference: ReferenceKind = ReferenceKind.auto
    """dpo: what the loss is measured against. model: a frozen copy of the starting policy;
    adapters_off: the LoRA base (adapters disabled, no copy); precomputed: the starting policy's
    log-probs computed once and cached on their meaning, beside the encode cache
    (`<data.cache_dir>/../reference/<key>.npy`); none: reference-free losses. auto:
    none for simpo/orpo, adapters_off with LoRA, else model."""
    reference_dtype: ReferenceDtype = ReferenceDtype.same
    """dpo, reference=model: the frozen copy's parameter dtype (bf16 halves its memory)."""
    gate_tolerance: Optional[float] = None
    """dpo: the step-0 gate's bound per target token (nats) on |batched - alone| summed log-probs and
    on |policy - reference|; null: 1e-4 in fp32, 5e-2 under bf16 autocast, and 5e-2 for the reference
    check of a bf16 frozen copy (reference_dtype=bf16) (docs/objectives.md)."""

    def ignored(self, key: str) -> dict[str, str]:
        """The preference keys, under an objective that does not read them (see `check_ignored`)."""
        return _read({f.name: _only("objective", self.kind, [ObjectiveKind.dpo]) for f in fields(self)
                      if f.name != "kind"})

    def __post_init__(self) -> None:
        from align.objectives.preference_spec import check_hyperparameters, needs_reference

        if self.kind != ObjectiveKind.dpo:
            return
        try:
            check_hyperparameters(self.loss, beta=self.beta, label_smoothing=self.label_smoothing,
                                  simpo_gamma=self.simpo_gamma)
        except ValueError as e:
            key, _, msg = str(e).partition(": ")
            raise ConfigError(f"objective.{key}" if key != "loss" else "objective.loss", msg) from None
        free = not needs_reference(self.loss)
        if free:
            _require(self.reference in (ReferenceKind.auto, ReferenceKind.none), "objective.reference",
                     f"loss={self.loss} is reference-free: use auto or none", self.reference.value)
        else:
            _require(self.reference != ReferenceKind.none, "objective.reference",
                     f"loss={self.loss} needs a reference: auto, model, adapters_off or precomputed", "none")
        if self.gate_tolerance is not None:
            _require(math.isfinite(self.gate_tolerance) and self.gate_tolerance > 0, "objective.gate_tolerance",
                     "must be a finite number > 0", self.gate_tolerance)


# ----------------------------------------------------------------------------------------- probe


@dataclass
class ScalingProbeConfig:
    lengths: list[int] = field(default_factory=lambda: [128, 256, 512])
    """Sequence lengths w to time fwd+bwd at (>= 3 distinct: a 2-point fit is undetermined, playbook 1.1)."""
    batch_size: Optional[int] = None
    """Rows per timed batch, fixed across lengths; null: `sampler.micro_batch_size`."""
    warmup: int = 1
    """Untimed fwd+bwd passes at each length before timing."""
    repeats: int = 2
    """Timed passes at each length; the best (fastest) one is kept."""
    residual_tol: float = 0.01
    """A fit 'closes' when every relative residual is within plus or minus this."""
    measure_steps: int = 3
    """Real trainer steps on the real data stream, timed to check the prediction against (after one warm-up step)."""

    def __post_init__(self) -> None:
        _require(len(set(self.lengths)) >= 3, "probe.scaling.lengths",
                 "needs at least 3 distinct lengths: a 2-point fit over {linear, quadratic, fixed} is undetermined "
                 "(playbook 1.1)", self.lengths)
        _require(all(w >= 1 for w in self.lengths), "probe.scaling.lengths", "every length must be >= 1", self.lengths)
        if self.batch_size is not None:
            _require(self.batch_size >= 1, "probe.scaling.batch_size", "must be >= 1 or null", self.batch_size)
        _require(self.warmup >= 0, "probe.scaling.warmup", "must be >= 0", self.warmup)
        _require(self.repeats >= 1, "probe.scaling.repeats", "must be >= 1", self.repeats)
        _require(0 < self.residual_tol < 1, "probe.scaling.residual_tol", "must be in (0, 1)", self.residual_tol)
        _require(self.measure_steps >= 1, "probe.scaling.measure_steps", "must be >= 1", self.measure_steps)


@dataclass
class KernelsProbeConfig:
    warmup: int = 2
    """Untimed trainer steps first (allocator, kernel selection, autotuning)."""
    timed_steps: int = 3
    """Trainer steps timed WITHOUT the profiler: throughput and MFU come from these."""
    steps: int = 3
    """Trainer steps under torch.profiler: the kernel table and launches per step come from these."""
    trace: bool = False
    """Also write a Chrome trace (trace.json, can be large) of the profiled steps."""

    def __post_init__(self) -> None:
        _require(self.warmup >= 0, "probe.kernels.warmup", "must be >= 0", self.warmup)
        _require(self.timed_steps >= 1, "probe.kernels.timed_steps", "must be >= 1", self.timed_steps)
        _require(self.steps >= 1, "probe.kernels.steps", "must be >= 1", self.steps)


@dataclass
class MaskProbeConfig:
    records: int = 64
    """Records encoded to make the probe's batches (real tokens; the probe needs few)."""
    length: Optional[int] = None
    """Tokens per probe row; null: sliding_window + 16 (at least 64), so the window binds."""

    def __post_init__(self) -> None:
        _require(self.records >= 1, "probe.mask.records", "must be >= 1", self.records)
        if self.length is not None:
            _require(self.length >= 2, "probe.mask.length", "must be >= 2 or null", self.length)


@dataclass
class PaddingProbeConfig:
    bucket_sizes: list[int] = field(default_factory=lambda: [2, 8, 32, 128, 512, 0])
    """Bucket sizes swept beside a pure shuffle; 0 means the whole data set (a full length sort)."""
    window: Optional[int] = None
    """Micro-batches per accumulation window for roots/window; null: trainer.grad_accum."""

    def __post_init__(self) -> None:
        _require(all(b >= 0 for b in self.bucket_sizes), "probe.padding.bucket_sizes", "must be >= 0 (0: all)", self.bucket_sizes)
        if self.window is not None:
            _require(self.window >= 1, "probe.padding.window", "must be >= 1 or null", self.window)


@dataclass
class ProbeConfig:
    """Options of `python -m align.probe probe=<name>`; `align.train` does not read them."""

    name: Optional[str] = None
    """Which probe runs (the option of the `probe` group): see align/probe.py for those available."""
    scaling: ScalingProbeConfig = field(default_factory=ScalingProbeConfig)
    """`probe=scaling`: the step's scaling curve t(w) = A*w + B*w^2 (playbook 1)."""
    kernels: KernelsProbeConfig = field(default_factory=KernelsProbeConfig)
    """`probe=kernels`: device-kernel table from torch.profiler (playbook 3.3, 3.4, 3.7)."""
    mask: MaskProbeConfig = field(default_factory=MaskProbeConfig)
    """`probe=mask`: attention-mask band structure per layer type (playbook 3.6)."""
    padding: PaddingProbeConfig = field(default_factory=PaddingProbeConfig)
    """`probe=padding`: the bucket sweep from the data alone (playbook 3.2)."""

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`). align.train composes
        no probe (name null): every probe's options are then unread."""
        subs = ("scaling", "kernels", "mask", "padding")
        if self.name is None:
            return {s: f"ignored by align.train; it is read by `python -m align.probe {key}={s}`" for s in subs}
        return _read({s: _only(key, self.name, [s]) for s in subs})


# ------------------------------------------------------------------------------------------ root


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    allow_dirty: bool = False
    """Start even when the git tree has uncommitted changes (the manifest then says dirty)."""
    name: Optional[str] = None
    """Run name for W&B and the manifest; null: the run dir's name."""
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """Probe options, composed only by `conf/probe.yaml` (`python -m align.probe probe=<name>`)."""

    def __post_init__(self) -> None:
        if self.optimizer.overlap:  # FSDP2 runs its own streams; a compiled block would trace the waits
            _require(self.parallel.kind == ParallelKind.single, "optimizer.overlap",
                     f"needs parallel=single (got parallel={self.parallel.kind.value})", True)
            _require(not self.trainer.compile, "optimizer.overlap", "needs trainer.compile=false", True)
        if self.logger.log_model:
            _require(self.logger.kind == LoggerKind.wandb and self.trainer.export, "logger.log_model",
                     "needs logger=wandb and trainer.export=true (the artifact is the export)", True)
        if self.optimizer.compile:
            _require(self.optimizer.name == OptimizerName.adamw, "optimizer.compile",
                     f"needs optimizer=adamw (got {self.optimizer.name.value})", True)
        pairs = self.objective.kind == ObjectiveKind.dpo
        _require(self.data.holds_pairs == pairs, "data",
                 f"objective={self.objective.kind.value} trains on "
                 + ("preference pairs: use data=gsm8k_pairs or data=preference" if pairs else
                    "records, not preference pairs: use objective=dpo with this data"), self.data.source.value)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields of several groups whose reader depends on another group (see `check_ignored`)."""
        out = {}
        if self.sampler.kind == SamplerKind.budget and self.probe.name is None:
            out["sampler.micro_batch_size"] = ("ignored by sampler=budget (rows per micro-batch follow "
                                               "sampler.max_tokens); it is read by sampler=shuffle, sampler=bucket")
        if self.parallel.kind == ParallelKind.ep and not self.model.pretrained:
            out["model.init_on_device"] = "ignored by parallel=ep; it is read by parallel=single, parallel=fsdp"
        return out


# The one table: config group -> schema. conf/<group>/*.yaml files are validated against these.
GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "sampler": SamplerConfig,
    "attention": AttentionConfig,
    "optimizer": OptimizerConfig,
    "parallel": ParallelConfig,
    "logger": LoggerConfig,
    "trainer": TrainerConfig,
    "objective": ObjectiveConfig,
    "probe": ProbeConfig,
}


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def to_typed(cfg: DictConfig) -> TrainConfig:
    """The seam from composed config to objects; every refusal surfaces as `ConfigError`: keys and
    non-finite floats first (`check_composed`), then each `__post_init__`, then `check_ignored`."""
    check_composed(cfg)
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig), type(obj)
    check_ignored(obj)
    return obj


# --------------------------------------------------------------------- checks over every schema


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _unwrap(tp: Any) -> Any:
    """Optional[X] -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


@functools.cache
def schema_fields(cls: type) -> dict[str, Any]:
    """A schema's fields and their types, in declaration order (Optional unwrapped)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(cls)}


def _mapped_schema(tp: Any) -> Optional[type]:
    """The schema of the values of a `dict[str, Schema]` field; None for any other type (an open
    mapping such as `model.overrides` takes any key)."""
    if typing.get_origin(tp) is dict:
        value = _unwrap(typing.get_args(tp)[1])
        return value if dataclasses.is_dataclass(value) else None
    return None


def unknown_key(dotted: str, root: Optional[type] = None) -> Optional[ConfigError]:
    """The error for a dotted key no schema declares, naming the schema it falls in, its keys and
    the closest one; None when the key is declared or lies inside an open mapping."""
    parts, cls, i = dotted.split("."), root or TrainConfig, 0
    while i < len(parts):
        fields_ = schema_fields(cls)
        if parts[i] not in fields_:
            parent, bad = ".".join(parts[:i]), ".".join(parts[:i + 1])
            close = difflib.get_close_matches(parts[i], list(fields_), n=1)
            mean = f" (did you mean {_join(parent, close[0])}?)" if close else ""
            return ConfigError(bad, f"unknown key{' in ' + parent if parent else ''}{mean}; accepted keys: "
                                    f"{', '.join(fields_)}")
        tp, i = fields_[parts[i]], i + 1
        if dataclasses.is_dataclass(tp):
            cls = tp
        elif _mapped_schema(tp) is not None and i < len(parts):
            cls, i = _mapped_schema(tp), i + 1  # parts[i] names an entry of the mapping
        else:
            return None
    return None


def _check_finite(value: Any, key: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, "must be a finite number", value)
    if isinstance(value, (ListConfig, list)):
        for v in value:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(key, "every element must be a finite number", list(value))
            _check_finite(v, key)
    elif isinstance(value, (DictConfig, dict)):
        for k in value:
            _check_finite(value[k], _join(key, str(k)))


def check_composed(node: DictConfig, cls: Optional[type] = None, key: str = "") -> None:
    """Refuse what omegaconf lets through: a key the schema does not declare (`+group.key=value`
    adds one to a typed node, and `to_object` would drop it), and a non-finite float in any field
    (`lr=inf` passes `lr > 0`; `max_grad_norm=nan` fails `> 0` and turns clipping off)."""
    fields_ = schema_fields(cls or TrainConfig)
    for name in node.keys():
        k = _join(key, str(name))
        if name not in fields_:
            raise unknown_key(k) or ConfigError(k, "unknown key")
        if OmegaConf.is_missing(node, name):
            continue
        value, tp = node[name], fields_[name]
        if dataclasses.is_dataclass(tp) and isinstance(value, DictConfig):
            check_composed(value, tp, k)
        elif _mapped_schema(tp) is not None and isinstance(value, DictConfig):
            for entry in value.keys():
                check_composed(value[entry], _mapped_schema(tp), f"{k}.{entry}")
        else:
            _check_finite(value, k)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _first_set(value: Any, default: Any, key: str) -> Optional[tuple[str, Any]]:
    """The first (key, value) below `key` that differs from its default; None when none does."""
    if dataclasses.is_dataclass(value) and type(value) is type(default):
        for f in dataclasses.fields(value):
            hit = _first_set(getattr(value, f.name), getattr(default, f.name), f"{key}.{f.name}")
            if hit:
                return hit
        return None
    return None if value == default else (key, value)


def check_ignored(obj: Any, key: str = "") -> None:
    """Refuse a field set to anything but its default while the composed choice does not read it
    (`data.path=...` under data=gsm8k trained on GSM8K). Each schema's `ignored(key)` maps the
    fields its current choice leaves unread (dotted, for a reader in another group) to why."""
    for dotted, why in (obj.ignored(key) if hasattr(obj, "ignored") else {}).items():
        *up, name = dotted.split(".")
        owner = functools.reduce(getattr, up, obj)
        f = next(f for f in dataclasses.fields(owner) if f.name == name)
        hit = _first_set(getattr(owner, name), _default(f), _join(key, dotted))
        if hit:
            raise ConfigError(hit[0], why, _plain(hit[1]))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_ignored(value, _join(key, f.name))
        elif isinstance(value, dict):
            for entry, sub in value.items():
                if dataclasses.is_dataclass(sub):
                    check_ignored(sub, f"{_join(key, f.name)}.{entry}")


register()
