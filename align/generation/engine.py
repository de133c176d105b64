"""The generation interface: what a caller asks for (`SamplingSpec`), what it gets back (`Completion`), the
`Engine` protocol every backend implements, and the engine's own settings (`EngineConfig`).

Log-probs. Every completion carries two per-token log-probs of each generated token:

- `logprobs`: log softmax(logits / T) at the sampled token, T = the sampling temperature (T = 1 for greedy),
  over the whole vocabulary. This is what TRL's GRPOTrainer and veRL's actor recompute on the rollout's
  tokens (both divide the logits by the rollout temperature before the log-softmax), so a trainer that
  recomputes the same quantity on the same tokens must match it up to numerics: the mismatch check.
- `sampler_logprobs`: the log-prob under the distribution the token was actually drawn from, i.e. after
  temperature AND top-k/top-p truncation, renormalised over the kept tokens (vLLM's
  `logprobs_mode="processed_logprobs"`, which TRL asks vLLM for in its importance-sampling correction).
  It equals `logprobs` when neither top-k nor top-p truncates, and is 0 (log 1) for greedy decoding,
  whose behaviour distribution is a point mass.

Neither is the raw (temperature-1) model log-prob unless T = 1. Both are computed in float32 from the
logits the model produced at that step.

Randomness. A call draws from seeds derived from `SamplingSpec.seed` only (never from the caller's RNG
stream, which a call leaves as it found it), so a rollout is repeated exactly by calling again with the
same seed, prompts, spec and engine settings: a resumed RL run re-derives the seed from its own state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

from align.errors import ConfigError


class FinishReason(StrEnum):
    stop = "stop"
    """A stop token was generated; it is the completion's last token."""
    length = "length"
    """`max_new_tokens` tokens were generated without a stop token."""


@dataclass(frozen=True)
class SamplingSpec:
    """What to generate for every prompt of one `Engine.generate` call."""

    max_new_tokens: int = 256
    """Most tokens generated per completion (a stop token counts)."""
    temperature: float = 1.0
    """Softmax temperature; 0 decodes greedily (argmax), which leaves nothing to sample."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 keeps all)."""
    top_k: int = 0
    """Keep only the top_k most probable tokens before sampling (0 keeps all)."""
    n: int = 1
    """Completions per prompt (GRPO's group size)."""
    seed: int = 0
    """Seed of this call's draws; the same seed repeats the same completions."""
    stop_token_ids: Optional[tuple[int, ...]] = None
    """Token ids that end a completion (kept as its last token). None: the engine's EOS ids; (): none."""

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1", self.max_new_tokens),
            (self.temperature >= 0, "temperature", "must be >= 0 (0 decodes greedily)", self.temperature),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 keeps every token)", self.top_k),
            (self.n >= 1, "n", "must be >= 1", self.n),
            (self.seed >= 0, "seed", "must be >= 0", self.seed),
        ]
        for ok, key, msg, value in checks:
            if not ok:
                raise ConfigError(f"sampling.{key}", msg, value)
        if self.greedy and (self.top_p != 1 or self.top_k != 0):
            raise ConfigError("sampling.top_p", "temperature 0 decodes greedily: top_p and top_k do not apply; "
                              "leave them at 1.0 and 0", (self.top_p, self.top_k))
        if self.greedy and self.n > 1:
            raise ConfigError("sampling.n", "temperature 0 decodes greedily: n > 1 would repeat one completion", self.n)
        if self.stop_token_ids is not None:
            if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
                raise ConfigError("sampling.stop_token_ids", "must be non-negative token ids", self.stop_token_ids)
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Completion:
    """One generated continuation of one prompt. Token ids exclude the prompt; a stop token is included."""

    prompt_index: int
    """Index of the prompt in the list given to `generate`."""
    sample_index: int
    """Which of the prompt's `n` completions this is (0-based)."""
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Per token: log softmax(logits / T) at the token (module docstring)."""
    sampler_logprobs: tuple[float, ...]
    """Per token: log-prob under the truncated distribution actually sampled from (module docstring)."""
    finish_reason: FinishReason
    router_topk: Any = field(default=None, compare=False)
    """MoE, where the engine records routing (`AlignEngine.record_routers`): an int tensor [MoE layers,
    tokens, k], the experts each layer's router picked at the position that predicted each token; else None."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class Backend(StrEnum):
    auto = "auto"
    """align where it runs (`resolve_backend`), else hf; the manifest records which and why."""
    hf = "hf"
    """transformers' `model.generate` on the model object itself (align.generation.hf)."""
    align = "align"
    """align's own decode loop over transformers' model classes: a slot KV cache, live-length attention,
    continuous batching, sampling on the device, CUDA graphs (align.generation.align_engine)."""


class GenerateMode(StrEnum):
    auto = "auto"
    """compiled on CUDA, dynamic elsewhere."""
    dynamic = "dynamic"
    """transformers' dynamic KV cache, eager forward."""
    static = "static"
    """Static (preallocated) KV cache, eager forward."""
    compiled = "compiled"
    """Static KV cache with the decode step under torch.compile (CUDA only)."""


@dataclass
class EngineConfig:
    """How the engine runs; none of it changes what a greedy call returns."""

    backend: Backend = Backend.auto
    """Which engine implementation runs the calls: auto, align or hf (`resolve_backend`)."""
    mode: GenerateMode = GenerateMode.auto
    """KV cache and compilation of the decode step (`GenerateMode`)."""
    batch_size: int = 64
    """hf: rows (prompt x completion) per `generate` call of the backend; bounds memory, and is part of a
    sampled stream's identity (each batch draws from its own seed). align: rows decoding at once (the
    KV cache's slots); a row's draws do not depend on it."""
    pad_to_multiple_of: int = 8
    """Left-pad each batch's prompts to a multiple of this, so a static cache and the compiled decode
    see a bounded set of shapes."""
    sync_every: int = 8
    """align backend: decode steps between two looks from the host at which rows have finished (each
    look is one device sync; a finished row idles until the next look, then its slot takes a waiting
    prompt)."""
    lockstep: bool = False
    """Every rank of the process group keeps decoding until all ranks' batches have finished
    (transformers' `synced_gpus`): needed when the weights are sharded (FSDP), where every forward is
    collective. Every rank must then make the same number of backend calls."""

    def __post_init__(self) -> None:
        for key, kind in (("backend", Backend), ("mode", GenerateMode)):
            try:
                setattr(self, key, kind(getattr(self, key)))
            except ValueError:
                raise ConfigError(f"generation.{key}", f"accepted: {', '.join(k.value for k in kind)}",
                                  getattr(self, key)) from None
        if self.batch_size < 1:
            raise ConfigError("generation.batch_size", "must be >= 1", self.batch_size)
        if self.sync_every < 1:
            raise ConfigError("generation.sync_every", "must be >= 1", self.sync_every)
        if self.pad_to_multiple_of < 1:
            raise ConfigError("generation.pad_to_multiple_of", "must be >= 1", self.pad_to_multiple_of)


def resolve_mode(mode: GenerateMode, device_type: str) -> GenerateMode:
    """The mode that runs on `device_type`. On CUDA the static cache with a compiled decode step is the
    default, because it beat the dynamic cache where it was measured (docs/generation.md); on CPU
    transformers does not compile the decode step, so the dynamic cache is the default there."""
    if mode is GenerateMode.auto:
        return GenerateMode.compiled if device_type == "cuda" else GenerateMode.dynamic
    if mode is GenerateMode.compiled and device_type != "cuda":
        raise ConfigError("generation.mode", f"compiled needs a CUDA device (the model is on {device_type}); "
                          f"choose dynamic or static", mode.value)
    return mode


SLOT_POSITIONS_MULTIPLE = 64
"""align's engine sizes its cache to the call's longest prompt plus its new tokens, rounded up to this
(so calls of similar lengths reuse one cache and its captured graphs)."""


def kv_positions(backend: Backend, rows: int, prompt_tokens: int, new_tokens: int, pad_to_multiple_of: int) -> int:
    """Positions (over all rows) the KV cache of one call holds: hf's static cache is `rows` rows of the
    prompt width left-padded to `pad_to_multiple_of` plus the new tokens; align's is `rows` slots and a
    spare of the prompt plus new tokens rounded up to `SLOT_POSITIONS_MULTIPLE`. auto: the larger."""
    hf = rows * (-(-prompt_tokens // pad_to_multiple_of) * pad_to_multiple_of + new_tokens)
    align = (rows + 1) * (-(-(prompt_tokens + new_tokens) // SLOT_POSITIONS_MULTIPLE) * SLOT_POSITIONS_MULTIPLE)
    return {Backend.hf: hf, Backend.align: align}.get(backend, max(hf, align))


def resolve_backend(cfg: EngineConfig) -> tuple[Backend, str]:
    """The backend `cfg` resolves to before a model is seen, and why. auto is align's own engine unless
    the weights are sharded (lockstep: every decode step is a collective that all ranks must enter
    together, which align's loop does not do). `build_engine` may still fall back from auto to hf for a
    model whose layers align's cache cannot address (align/generation/__init__.py)."""
    if cfg.backend is Backend.align and cfg.lockstep:
        raise ConfigError("generation.backend", "align's engine does not decode in lockstep (sharded weights, "
                          "several ranks); use hf or auto", cfg.backend.value)
    if cfg.backend is not Backend.auto:
        return cfg.backend, "requested"
    if cfg.lockstep:
        return Backend.hf, "auto: sharded weights decode in lockstep, which only transformers' generate does"
    return Backend.align, "auto: align's own engine"


def derive_seed(seed: int, *path: int) -> int:
    """A 63-bit seed for one part of a call (e.g. one batch), a pure function of the call's seed and the
    part's position: nothing depends on what ran before in the process."""
    digest = hashlib.sha256("/".join(str(x) for x in (seed, *path)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@runtime_checkable
class Engine(Protocol):
    """Batched prompts in, completions out. A backend that runs on a separate copy of the weights (an
    external server, an inference copy in another dtype) is brought up to date with `sync_from`."""

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Completion]:
        """`spec.n` completions per prompt, ordered by (prompt_index, sample_index)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records: backend, cache, compile, dtype, device, weights sharing, versions."""
        ...

    def sync_from(self, model: Any) -> None:
        """Make the engine's weights equal to `model`'s (nothing to do when it shares them)."""
        ...

    def weights_hash(self) -> str:
        """A fingerprint of the weights the engine generates with now: sha256 over names, shapes, dtypes
        and per-tensor checksums computed on the weights' device (align/generation/fingerprint.py)."""
        ...
