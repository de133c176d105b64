"""Parameter counts (total, active per token for MoE, trainable) and a training-memory estimate.

Counts come from the model itself, built on the meta device (no weights, milliseconds), so they
cannot drift from transformers. Memory is arithmetic on those counts plus an activation model:

- weights: parameters x bytes of `model.dtype` (4-bit NF4 base linears for QLoRA: ~0.56 B/param)
- grads: trainable parameters x their bytes (LoRA adapters are fp32 under a bf16 base, peft's default)
- optimizer: AdamW keeps two states in the parameter dtype; 8-bit AdamW 2 bytes per parameter
- activations at `sampler.micro_batch_size x data.max_seq_len` tokens (the padded worst case), saved
  per decoder layer for backward (all layers, or block inputs plus one layer under activation
  checkpointing), plus the logits and their fp32 cross-entropy copies.
- the objective's own terms (align/objectives/plan_terms.py): how its micro-batches are cut, a frozen
  reference copy (dpo, grpo), and grpo's generation copy (`objective.generation_dtype` bf16/fp32: its
  parameters in its dtype) and the KV cache of one engine call (`objective.generation_batch_size` rows
  at the longest prompt + `max_new_tokens`), which lives between optimizer steps, in place of the
  step's working set. Its sequences are at most the longest prompt + `max_new_tokens` wide
  (align/plan/generation_auto.py `rollout_width`): where the prompts have been read (`prompt_tokens`,
  at plan time) that, else the bound `data.max_seq_len`. A reward model grpo scores with (`reward.path`):
  its weights in the dtype it is loaded in, held for the whole run, and one no-grad forward of
  `reward.model_batch_size` completions, which runs in the rollout beside the KV cache.

It is an estimate: the GPU smoke runs print it beside `torch.cuda.max_memory_allocated` to keep it
honest (docs/models.md). The check refuses a config whose estimate exceeds the visible device's
memory unless `model.allow_over_memory=true`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from align.config import ModelConfig, OptimizerName, TrainConfig
from align.config.data import require_resolved
from align.config.trainer_config import require_chunk_resolved, require_memory_budget_resolved
from align.models.family import family_spec
from align.models.family_table import MoEShape, ParamCount, count_params
from align.objectives.plan_terms import terms_for

GiB = 1024**3


def bundled_vocab() -> tuple[int, dict[str, int]]:
    """Size and special-token ids of the bundled tokenizer, read from its JSON without loading it
    (preflight runs before the tokenizer)."""
    import json

    from align.data.tokenizer import bundled_tokenizer_dir

    d = json.loads((bundled_tokenizer_dir() / "tokenizer.json").read_text())
    tc = json.loads((bundled_tokenizer_dir() / "tokenizer_config.json").read_text())
    added = {t["content"]: t["id"] for t in d.get("added_tokens", [])}
    ids = set(d["model"]["vocab"].values()) | set(added.values())
    special = {f"{k}_token_id": added.get(tc.get(f"{k}_token")) for k in ("pad", "bos", "eos")}
    return max(ids) + 1, special


_META: dict[str, tuple[Any, Any]] = {}
_META_KEEP = 4
"""Meta models kept: the last few configs asked for (a preflight and a run's start ask for one)."""


def meta_model(cfg: ModelConfig):
    """The model on the meta device (shapes only) and its config, built once per model config: the
    preflight's checks, the kwargs sites, the serving line and `sampler.max_tokens=auto`'s search
    (an estimate per candidate budget) all read the same one, and none of them changes it."""
    key = repr(cfg)
    if key not in _META:
        if len(_META) >= _META_KEEP:
            _META.pop(next(iter(_META)))
        _META[key] = _build_meta_model(cfg)
    return _META[key]


def _build_meta_model(cfg: ModelConfig):
    from align.models.build import model_config

    _, model_cls = family_spec(cfg).classes()
    vocab, special = (None, None) if cfg.pretrained else bundled_vocab()
    config = model_config(cfg, vocab_size=vocab, special=special)
    with torch.device("meta"):
        model = model_cls._from_config(config)
    return model, config


@dataclass
class MemoryEstimate:
    """Bytes of a training step's peak. `activations`: what the decoder layers keep for backward;
    `logits`: the LM head's output and the loss's fp32 copies (one chunk under a chunked loss);
    `reference`: a frozen reference copy. Gradients are freed at every optimizer step
    (`zero_grad(set_to_none=True)`), so with one micro-batch per step they are allocated in backward
    as the activations are freed and the peak holds the larger of the two; under accumulation the
    gradients of the earlier micro-batches are held through the later ones' forward. grpo:
    `generation_copy`, the engine's copy of the weights (held for the whole run), and `kv_cache`, the KV
    cache of one engine call; a rollout is generated before the step's first forward, when the last
    step's gradients are freed and no activations are held, so the peak holds the larger of the KV
    cache and the step's working set (activations, logits, gradients), unless the engine keeps its cache
    between calls (`kv_cache_held`: align's engine, `cache_held`): then
    the cache is held beside the working set. `scoring_model`: the weights of a reward model grpo scores
    with (held for the whole run); `scoring_activations`: one no-grad forward of it at its batch, which
    runs in the rollout, beside the KV cache the engine keeps."""

    params: ParamCount
    tokens_per_micro_batch: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    device: str
    device_bytes: Optional[int]
    logits: int = 0
    reference: int = 0
    grads_accumulate: bool = False
    generation_copy: int = 0
    kv_cache: int = 0
    kv_cache_held: bool = False
    scoring_model: int = 0
    scoring_activations: int = 0

    @property
    def total(self) -> int:
        working = self.activations + self.logits
        held = working + self.grads if self.grads_accumulate else max(working, self.grads)
        if self.kv_cache_held:  # the cache through the rollout (beside the scorer's forward) and the update
            step = self.kv_cache + max(held, self.scoring_activations)
        else:
            step = max(held, self.kv_cache + self.scoring_activations)
        return self.weights + self.optimizer + self.reference + self.generation_copy + self.scoring_model + step

    @property
    def fits(self) -> Optional[bool]:
        return None if self.device_bytes is None else self.total <= self.device_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "fits": self.fits}

    def line(self) -> str:
        p = self.params
        act = f", {p.active / 1e9:.3f}B active" if p.active != p.total else ""
        dev = "unknown" if self.device_bytes is None else f"{self.device_bytes / GiB:.1f} GiB"
        ref = f", reference {self.reference / GiB:.1f}" if self.reference else ""
        ref += f", generation copy {self.generation_copy / GiB:.1f}" if self.generation_copy else ""
        ref += (f", KV cache {self.kv_cache / GiB:.1f}{' (held between calls)' if self.kv_cache_held else ''}"
                if self.kv_cache else "")
        ref += (f", reward model {self.scoring_model / GiB:.1f} + its forward {self.scoring_activations / GiB:.1f}"
                if self.scoring_model else "")
        return (f"params {p.total / 1e9:.3f}B{act}, {p.trainable / 1e9:.3f}B trainable; training memory ~"
                f"{self.total / GiB:.1f} GiB at peak (weights {self.weights / GiB:.1f}, grads {self.grads / GiB:.1f}, "
                f"optimizer {self.optimizer / GiB:.1f}{ref}, activations {self.activations / GiB:.1f} and logits "
                f"{self.logits / GiB:.1f} at {self.tokens_per_micro_batch} tokens per micro-batch) "
                f"vs {self.device} {dev}")


def _nbytes(dtype: Optional[str]) -> int:
    return {None: 4, "float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers: the modules named `layers.<i>` (transformers' usual name), else the entries of
    the model's longest ModuleList (a class that names them otherwise, GPT-2's `h.<i>`)."""
    layers = [m for n, m in model.named_modules() if re.fullmatch(r".*layers\.\d+", n)]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def activation_elements_per_token(model: torch.nn.Module, moe: Optional[MoEShape]) -> int:
    """Elements saved for backward per token, summed over decoder layers (an approximation read off
    the module shapes, so heterogeneous layers such as Gemma-4's global ones count as they are):
    every nn.Linear keeps its input and hands its output to an op that keeps it, norms and residuals
    ~4 hidden vectors, and each routed slot of an MoE layer its gathered input, gate/up, activation,
    product and down output. sdpa/flash keep no S x S matrix; eager attention would (not counted)."""
    total = 0
    for layer in decoder_layers(model):
        n = 0
        hidden = None
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                n += mod.in_features + mod.out_features
                hidden = hidden or mod.in_features
        for name, p in layer.named_parameters():
            if p.dim() == 3 and moe is not None and name.endswith("down_proj"):
                h, width = p.shape[1], p.shape[2]
                n += moe.top_k * (2 * h + 4 * width) + 3 * moe.num_experts
        total += n + 4 * (hidden or 0)
    return total


def device_memory(device: torch.device) -> Optional[int]:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def tokens_per_micro_batch(cfg: TrainConfig, prompt_tokens: Optional[int] = None) -> int:
    """The most tokens (padding included) one forward of the run holds, as its objective's batching cuts
    them (align/objectives/plan_terms.py: the sampler's rows or budget for sft and dpo, the rollout's
    completions for grpo, whose sequences `prompt_tokens` bounds where the prompts have been read)."""
    require_resolved(cfg.sampler.max_tokens, "the memory estimate")
    return terms_for(cfg).tokens_per_micro_batch(cfg, prompt_tokens)


def logits_bytes(chunk: int, tokens: int, vocab: int, softcap: Optional[float], compute_bytes: int) -> int:
    """The LM head's output in the compute dtype plus the loss's fp32 upcast, log-softmax and gradient
    (and, under a final logit soft-cap, its division and tanh: two fp32 copies more), over the tokens
    one loss call holds: all of them, or under a `chunk` > 0 one chunk (the chunked loss takes each
    chunk's gradients in the forward and keeps no logits for backward). For a chunk the count is an
    upper bound: the chunked loss holds the compute-dtype logits, two fp32 copies under a soft-cap (one
    without) and a compute-dtype gradient. It is kept because the chunked rows of docs/benchmarks/log.md's
    estimate-vs-peak table were measured with an earlier loss that held more."""
    held = min(tokens, chunk) if chunk > 0 else tokens
    return held * vocab * (compute_bytes + 3 * 4 + (2 * 4 if softcap else 0))


def compute_bytes(cfg: TrainConfig, device: torch.device) -> int:
    """Bytes per element of the activations: 2 under CUDA autocast (bf16/fp16), else the weights'."""
    return 2 if (device.type == "cuda" and cfg.trainer.precision.value != "fp32") else _nbytes(cfg.model.dtype)


def layer_activation_bytes(cfg: TrainConfig, model: torch.nn.Module, config: Any, moe: Optional[MoEShape],
                           tokens: int, compute_bytes: int, budget: float = 1.0) -> int:
    """What the decoder layers keep for backward at `tokens`: every layer's saved tensors, or under
    activation checkpointing only the inputs of the checkpointed blocks (the fraction the config asks)
    plus the full activations of the one block being recomputed. `budget` (trainer.compile_memory_budget
    of compiled blocks): a layer that is not checkpointed keeps its input plus that share of the rest,
    as the partitioner's knob is defined (0: the inputs, 1: its default)."""
    layers = max(config.num_hidden_layers, 1)
    per_layer = activation_elements_per_token(model, moe) * compute_bytes * tokens // layers
    block_input = config.hidden_size * compute_bytes * tokens
    kept = per_layer if budget >= 1 else block_input + int(budget * max(per_layer - block_input, 0))
    if not cfg.parallel.activation_checkpointing:
        return layers * kept
    from align.parallel.wrap import checkpointed_indices

    k = len(checkpointed_indices(layers, cfg.parallel.activation_checkpointing_fraction))
    return k * block_input + (layers - k) * kept + per_layer


def partitioner_budget(cfg: TrainConfig, device: torch.device) -> float:
    """trainer.compile_memory_budget where the blocks compile (trainer.compile=auto resolved as the
    trainer will), else 1: eager blocks keep what autograd saves."""
    from align.plan.compile_auto import blocks_compile

    budget = cfg.trainer.compile_memory_budget
    require_memory_budget_resolved(budget, "the memory estimate")
    if budget is None:
        return 1.0
    return float(budget) if blocks_compile(cfg, device.type) else 1.0


def reference_bytes(cfg: TrainConfig, params: int, wbytes: int) -> int:
    """A frozen copy of the policy where the objective keeps one (dpo, grpo with
    `objective.reference=model`), in its dtype; the other references (the LoRA base with adapters off,
    precomputed log-probs, none) hold no second copy (align/objectives/plan_terms.py)."""
    return terms_for(cfg).reference_bytes(cfg, params, wbytes)


def generation_copy_bytes(cfg: TrainConfig, params: int, device_type: str) -> int:
    """The engine's copy of the weights where the objective generates from one (grpo: its parameters in
    `objective.generation_dtype`, auto resolved as the trainer will on `device_type`); 0 where the engine
    generates with the training model, and under an objective that generates nothing."""
    return terms_for(cfg).generation_copy_bytes(cfg, params, device_type)


def kv_elements_per_token(model: torch.nn.Module) -> int:
    """Elements the KV cache keeps per position, summed over decoder layers: 2 (keys and values) x
    kv_heads x head_dim of each layer, read off its k_proj's output width (the model config's
    num_key_value_heads x head_dim, per layer where layers differ, as Gemma-4's global ones do; from the
    config where a layer has no k_proj, `_kv_width`). Windowed and KV-sharing layers count in full: an
    upper bound."""
    total = 0
    for layer in decoder_layers(model):
        k = next((m for n, m in layer.named_modules() if n.endswith("k_proj") and isinstance(m, torch.nn.Linear)),
                 None)
        total += 2 * (k.out_features if k is not None else _kv_width(getattr(model, "config", None)))
    return total


def _kv_width(config: Any) -> int:
    """kv_heads x head_dim from a model config, for a layer with no separate k_proj (Phi-3's fused
    qkv_proj): `num_key_value_heads` (else every head) x `head_dim` (else hidden_size / heads)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None) or 0
    if not heads:
        return 0
    kv = getattr(text, "num_key_value_heads", None) or heads
    return kv * (getattr(text, "head_dim", None) or text.hidden_size // heads)


def kv_cache_bytes(cfg: TrainConfig, device: torch.device, rows: Optional[int] = None,
                   prompt_tokens: Optional[int] = None) -> int:
    """The KV cache of one engine call of `rows` rows (default: the objective's rows per call): the
    positions the objective's generation holds (align/objectives/plan_terms.py; none under an objective
    that generates nothing) x `kv_elements_per_token` x bytes, in the generation copy's dtype, or with the
    training model in the compute dtype (`compute_bytes`)."""
    positions, nbytes = terms_for(cfg).kv_cache(cfg, device.type, rows, prompt_tokens)
    if not positions:
        return 0
    model, _ = meta_model(cfg.model)
    return positions * kv_elements_per_token(model) * (nbytes or compute_bytes(cfg, device))


def cache_held(cfg: Any, shards: int = 1) -> bool:
    """Whether the engine that will run keeps its KV cache allocated between calls, so through every
    update: align's engine does (its slots and the CUDA graphs captured on them outlive a call:
    align/generation/align_engine.py); transformers' `generate` builds its cache per call and frees it.
    auto resolves to align's engine except under sharded weights (lockstep) and for a model whose attention
    layers its cache cannot address (align/generation/__init__.py `build_engine`): those generate through hf."""
    from align.generation.align_engine import unsupported
    from align.generation.engine import Backend

    backend = cfg.objective.generation_backend
    if backend == Backend.hf or (backend == Backend.auto and shards > 1):
        return False
    return backend != Backend.auto or unsupported(meta_model(cfg.model)[0]) is None


def resident_bytes(cfg: TrainConfig, device: torch.device, prompt_tokens: Optional[int] = None) -> int:
    """What an engine call runs beside (unsharded): weights, optimizer state, a frozen reference, the
    generation copy and a reward model with its forward, as `estimate_memory` counts them."""
    model, config = meta_model(cfg.model)
    wbytes = _nbytes(cfg.model.dtype)
    counts, weights, _, optimizer = _states(cfg, model, family_spec(cfg.model).moe_shape(config), wbytes)
    return (weights + optimizer + reference_bytes(cfg, counts.total, wbytes)
            + generation_copy_bytes(cfg, counts.total, device.type) + sum(scoring_bytes(cfg, device, prompt_tokens)))


def scoring_bytes(cfg: TrainConfig, device: torch.device, prompt_tokens: Optional[int] = None) -> tuple[int, int]:
    """(weights, forward activations) of the reward model the objective scores with (align/objectives/plan_terms.py
    `scoring_model`; (0, 0) where none): its parameters at the bytes of the dtype it is loaded in, and what a
    no-grad forward holds at once per token, the residual stream in and out plus one decoder layer's
    intermediates (`activation_elements_per_token`'s count for one layer: each layer's are freed before the
    next runs), at the tokens of one forward, in that dtype."""
    found = terms_for(cfg).scoring_model(cfg, device.type, prompt_tokens)
    if found is None:
        return 0, 0
    model, nbytes, tokens = found
    weights = sum(p.numel() for p in model.parameters()) * nbytes
    text = model.config.get_text_config()
    per_layer = activation_elements_per_token(model, None) // max(len(decoder_layers(model)), 1)
    return weights, (per_layer + 2 * text.hidden_size) * nbytes * tokens


def estimate_memory(cfg: TrainConfig, device: torch.device, shards: int = 1,
                    prompt_tokens: Optional[int] = None) -> MemoryEstimate:
    """`shards`: how many ranks share weights, grads and optimizer state (FSDP); 1 = replicated.
    Works from the config alone (the model is built on the meta device), and under grpo the longest
    prompt where it is known (`prompt_tokens`; else `data.max_seq_len` bounds the rollout's sequences)."""
    spec = family_spec(cfg.model)
    model, config = meta_model(cfg.model)
    moe = spec.moe_shape(config)
    wbytes = _nbytes(cfg.model.dtype)
    counts, weights, grads, optimizer = _states(cfg, model, moe, wbytes)
    tokens = tokens_per_micro_batch(cfg, prompt_tokens)
    chunk = cfg.trainer.loss_chunk_tokens
    require_chunk_resolved(chunk, "the memory estimate")
    nbytes = compute_bytes(cfg, device)
    acts = layer_activation_bytes(cfg, model, config, moe, tokens, nbytes, partitioner_budget(cfg, device))
    logits = logits_bytes(chunk, tokens, config.vocab_size, getattr(config, "final_logit_softcapping", None),
                          nbytes)
    ref = reference_bytes(cfg, counts.total, wbytes)
    scoring, scoring_acts = scoring_bytes(cfg, device, prompt_tokens)
    s = max(1, shards)
    return MemoryEstimate(counts, tokens, weights // s, grads // s, optimizer // s, acts, str(device),
                          device_memory(device), logits=logits, reference=ref // s,
                          grads_accumulate=cfg.trainer.grad_accum > 1,
                          generation_copy=generation_copy_bytes(cfg, counts.total, device.type),
                          kv_cache=(kv := kv_cache_bytes(cfg, device, prompt_tokens=prompt_tokens)),
                          kv_cache_held=bool(kv) and cache_held(cfg, s),
                          scoring_model=scoring, scoring_activations=scoring_acts)


def _states(cfg: TrainConfig, model: torch.nn.Module, moe: Optional[MoEShape], wbytes: int
            ) -> tuple[ParamCount, int, int, int]:
    """Parameter counts and the bytes of weights, grads and optimizer state. Under LoRA the base is
    frozen in `model.dtype` (4-bit NF4 linears for QLoRA) and only the adapters, fp32 under a bf16
    base as peft makes them, have grads and AdamW state."""
    from align.models.lora import discover_targets

    lora = cfg.model.lora
    if lora.enabled:
        trainable = discover_targets(model, lora.target_modules).lora_params(lora.r)
        counts = count_params(model, moe, trainable=trainable)
        if lora.qlora:
            linear = sum(m.weight.numel() for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head"))
            weights = int((counts.total - linear) * wbytes + linear * 0.5625)
        else:
            weights = counts.total * wbytes
        grads, state_bytes = trainable * 4, 4
    else:
        counts = count_params(model, moe)
        trainable = counts.trainable
        weights = counts.total * wbytes
        grads, state_bytes = trainable * wbytes, wbytes
    optimizer = trainable * (2 if cfg.optimizer.name == OptimizerName.adamw8bit else 2 * state_bytes)
    return counts, weights, grads, optimizer
