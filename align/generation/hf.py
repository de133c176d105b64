"""The transformers backend: `model.generate` on the model object itself, batched with left padding.

Sampling runs through transformers' own warpers (temperature, top-k, top-p), handed to `generate` as a
logits-processor list so that one processor sees every step's logits before and after them and records
the two log-probs of `align.generation.engine` without keeping a (steps x batch x vocab) tensor: it
holds one step's tempered logits until the next step shows which token was drawn.

`generate` samples with `torch.multinomial` on the device's default generator; each batch runs inside
`torch.random.fork_rng` with that generator seeded from the call's seed, so the caller's RNG stream is
untouched and a call is repeatable.

The model's own `generation_config` (a checkpoint's `generation_config.json` may carry a repetition
penalty, top_k=50, min_p...) is set aside during a call: transformers fills every key a passed config
leaves unset from it, and a rollout must be exactly what its `SamplingSpec` says.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence

import torch
import transformers
from transformers import (
    CompileConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from align.errors import ConfigError
from align.generation.engine import (
    Backend,
    Completion,
    EngineConfig,
    FinishReason,
    GenerateMode,
    SamplingSpec,
    derive_seed,
    resolve_mode,
)
from align.generation.weights import ModelWeights


class _SampleRecorder(LogitsProcessor):
    """A logits processor: applies temperature and truncation (transformers' warpers) and records, for
    each generated token, its log-prob under the tempered and under the truncated distribution."""

    def __init__(self, spec: SamplingSpec) -> None:
        self.greedy = spec.greedy
        self.tempering = TemperatureLogitsWarper(1.0 if spec.greedy else spec.temperature)
        truncation = []
        if spec.top_k:
            truncation.append(TopKLogitsWarper(top_k=spec.top_k))
        if spec.top_p < 1:
            truncation.append(TopPLogitsWarper(top_p=spec.top_p))
        self.truncation = LogitsProcessorList(truncation)
        self._pending: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
        self._logprobs: list[torch.Tensor] = []
        self._sampler: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:  # the last column is the token drawn from the pending step
            self._take(input_ids[:, -1])
        tempered = self.tempering(input_ids, scores) if self.tempering.temperature != 1 else scores
        processed = self.truncation(input_ids, tempered)
        lse = tempered.logsumexp(-1)
        self._pending = (tempered, lse, processed.logsumexp(-1) if len(self.truncation) else lse)
        return processed

    def _take(self, tokens: torch.Tensor) -> None:
        tempered, lse_tempered, lse_processed = self._pending
        picked = tempered.gather(-1, tokens[:, None]).squeeze(-1)
        self._logprobs.append(picked - lse_tempered)
        self._sampler.append(torch.zeros_like(picked) if self.greedy else picked - lse_processed)
        self._pending = None

    def finish(self, new_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs, sampler_logprobs), each (batch, steps), for the generated tokens `new_tokens`."""
        if self._pending is not None:
            self._take(new_tokens[:, -1])
        if len(self._logprobs) != new_tokens.shape[1]:
            raise RuntimeError(f"recorded {len(self._logprobs)} steps for {new_tokens.shape[1]} generated tokens: "
                               "transformers' decoding loop no longer calls the processors once per token")
        return torch.stack(self._logprobs, 1), torch.stack(self._sampler, 1)


@contextlib.contextmanager
def _seeded(device: torch.device, seed: int) -> Iterator[None]:
    """Seed the generator `generate` samples from, restoring every generator it touches afterwards."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index], device_type="cuda"):
            torch.random.default_generator.manual_seed(seed)
            torch.cuda.default_generators[index].manual_seed(seed)
            yield
    else:
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            yield


@contextlib.contextmanager
def _generating(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and a blank default generation config for the call; both restored."""
    was_training, saved = model.training, model.generation_config
    model.eval()
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved
        model.train(was_training)


def _pad_left(prompts: list[Sequence[int]], pad_id: int, multiple: int, device: torch.device):
    width = -(-max(len(p) for p in prompts) // multiple) * multiple
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def _cut(tokens: list[int], logprobs: list[float], sampler: list[float], stops: set[int], max_new: int):
    """Truncate one row after its first stop token (kept); rows that never stopped ran to max_new."""
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[:i + 1], logprobs[:i + 1], sampler[:i + 1], FinishReason.stop
    if len(tokens) != max_new:
        raise RuntimeError(f"a row ended after {len(tokens)} of {max_new} tokens without a stop token")
    return tokens, logprobs, sampler, FinishReason.length


class HFEngine(ModelWeights):
    """`Engine` on transformers' `generate`. Built on the training model itself it shares its weights
    (`sync_from` that model does nothing); `HFEngine.copy_of` builds one on a separate copy."""

    backend = Backend.hf

    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, *, pad_token_id: int,
                 eos_token_ids: Sequence[int], shares_weights: bool = True) -> None:
        self.model = model
        self.cfg = cfg
        self.device = next(model.parameters()).device
        if self.device.type not in ("cpu", "cuda"):
            raise ConfigError("generation.backend", f"the hf engine runs on cpu or cuda, not {self.device.type}")
        self.mode = resolve_mode(cfg.mode, self.device.type)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.shares_weights = shares_weights

    # ---------------------------------------------------------------------------------------- calls

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Completion]:
        self.check_prompts(prompts)
        rows = [(p, s) for p in range(len(prompts)) for s in range(spec.n)]
        # Longest first, stable: batches of similar lengths pad little, and the order is a pure
        # function of the prompts, so the same call draws the same batches.
        order = sorted(range(len(rows)), key=lambda r: -len(prompts[rows[r][0]]))
        out: dict[int, Completion] = {}
        bs = self.cfg.batch_size
        for b, start in enumerate(range(0, len(order), bs)):
            chunk = order[start:start + bs]
            done = self._generate_batch([prompts[rows[r][0]] for r in chunk], spec, derive_seed(spec.seed, b))
            for r, (tokens, lps, sps, reason) in zip(chunk, done):
                out[r] = Completion(rows[r][0], rows[r][1], tuple(tokens), tuple(lps), tuple(sps), reason)
        return [out[r] for r in range(len(rows))]

    def _generation_config(self, spec: SamplingSpec, stops: tuple[int, ...]) -> GenerationConfig:
        compiled = self.mode is GenerateMode.compiled
        kw: dict[str, Any] = dict(
            max_new_tokens=spec.max_new_tokens, do_sample=not spec.greedy, num_beams=1, num_return_sequences=1,
            pad_token_id=self.pad_token_id, eos_token_id=list(stops) or None, use_cache=True,
            cache_implementation=None if self.mode is GenerateMode.dynamic else "static",
            disable_compile=not compiled, compile_config=CompileConfig() if compiled else None)
        if not spec.greedy:  # the warpers are ours (_SampleRecorder): transformers' own stay neutral
            kw.update(temperature=1.0, top_k=0, top_p=1.0)
        return GenerationConfig(**kw)

    def _generate_batch(self, prompts: list[Sequence[int]], spec: SamplingSpec, seed: int):
        stops = self.eos_token_ids if spec.stop_token_ids is None else spec.stop_token_ids
        ids, mask = _pad_left(prompts, self.pad_token_id, self.cfg.pad_to_multiple_of, self.device)
        recorder = _SampleRecorder(spec)
        with _seeded(self.device, seed), _generating(self.model):
            seqs = self.model.generate(input_ids=ids, attention_mask=mask,
                                       generation_config=self._generation_config(spec, stops),
                                       logits_processor=LogitsProcessorList([recorder]), synced_gpus=self.cfg.lockstep)
        new = seqs[:, ids.shape[1]:]
        lps, sps = recorder.finish(new)
        rows = zip(new.tolist(), lps.tolist(), sps.tolist())
        return [_cut(t, lp, sp, set(stops), spec.max_new_tokens) for t, lp, sp in rows]

    # -------------------------------------------------------------------------------- provenance

    def describe(self) -> dict[str, Any]:
        compiled = self.mode is GenerateMode.compiled
        return {
            "backend": self.backend.value,
            **getattr(self, "resolution", {"backend_requested": "hf", "backend_reason": "built directly"}),
            "entry": "transformers generate (GenerationMixin.generate)",
            "mode_requested": self.cfg.mode.value,
            "mode": self.mode.value,
            "cache_implementation": "dynamic" if self.mode is GenerateMode.dynamic else "static",
            "compile": compiled,
            "compile_config": CompileConfig().to_dict() if compiled else None,
            "device": str(self.device),
            "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
            "weights": "shared with the training model (no sync)" if self.shares_weights else "copy (sync_from)",
            "batch_size": self.cfg.batch_size,
            "pad_to_multiple_of": self.cfg.pad_to_multiple_of,
            "lockstep": self.cfg.lockstep,
            "pad_token_id": self.pad_token_id,
            "eos_token_ids": list(self.eos_token_ids),
            "logprobs": "log_softmax(logits / temperature) at the token; temperature 1 when greedy",
            "sampler_logprobs": "log-prob after temperature and top-k/top-p truncation, renormalised; 0 when greedy",
            "rng": "per batch: fork_rng, default generator seeded with sha256(seed/batch index)",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
