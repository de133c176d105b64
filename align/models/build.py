"""Build or load a model and record what it RESOLVED to (docs/pitfalls.md#3).

Kwargs for transformers are built as dicts first so preflight can check their names against the
installed signatures before anything heavy runs (`align.run.model_checks`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from align.config import AttentionConfig, AttnImpl, Family, ModelConfig
from align.errors import ConfigError
from align.models.attention import AttentionChoice, resolve_attention
from align.models.checkpoint_fit import family_problem, load_checked, loading
from align.models.family import family_spec
from align.models.family_table import FamilySpec, MoEShape, count_params
from align.models.kwargs import config_kwargs, load_kwargs, preset_kwargs
from align.models.layered_attention import plan as layered_plan
from align.models.lora import LoraGate, apply_lora, bnb_config, qlora_refusal
from align.models.runtime import ModelRuntime

log = logging.getLogger("align")


@dataclass
class BuiltModel:
    model: torch.nn.Module
    info: dict[str, Any] = field(default_factory=dict)
    """Requested and resolved backends, parameter counts, dtype, router losses applied, LoRA targets:
    goes into the manifest."""
    runtime: ModelRuntime = field(default_factory=ModelRuntime)
    """Router losses and telemetry, the LoRA gate: what the trainer calls per micro-step and per step."""


def _device_type(device: Optional[torch.device]) -> str:
    if device is not None:
        return torch.device(device).type
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_config_names(cfg: ModelConfig, kwargs: dict[str, Any], key: str) -> None:
    from align.models.lora import check_names

    spec = family_spec(cfg)
    config_cls, _ = spec.classes()
    check_names(config_cls, kwargs, key, extra=spec.extra_config_kwargs)


def model_config(cfg: ModelConfig, tokenizer=None, vocab_size: Optional[int] = None,
                 special: Optional[dict[str, Any]] = None):
    """The transformers config object the model is built from (local files only)."""
    if cfg.pretrained:
        why = family_problem(cfg.family, cfg.pretrained)  # before the config class reads another model's file
        if why:
            raise ConfigError("model.pretrained", why)
    config_cls, _ = family_spec(cfg).classes()
    if cfg.pretrained:
        check_config_names(cfg, dict(cfg.overrides), "model.overrides")
        with loading("model config", cfg.pretrained):
            return config_cls.from_pretrained(Path(cfg.pretrained), local_files_only=True, **cfg.overrides)
    kw = config_kwargs(cfg, tokenizer) if tokenizer is not None else preset_kwargs(cfg, vocab_size, special)
    check_config_names(cfg, kw, "model.overrides" if cfg.overrides else "model.preset")
    return config_cls(**kw)


def moe_shape_of(spec: FamilySpec, config) -> Optional[MoEShape]:
    return spec.moe_shape(config)


def check_router_losses(cfg: ModelConfig, moe: Optional[MoEShape]) -> None:
    """model.moe.* on a model without a router would be silently dropped: refused instead, and so are
    the router losses where align reads no router (`model=hf`'s generic MoE: FamilySpec.reads_routers)."""
    spec = family_spec(cfg)
    name = spec.name.value if spec.name != Family.hf else f"model=hf ({spec.architecture})"
    if moe is not None:
        for key, w in (("model.moe.lb_weight", cfg.moe.lb_weight), ("model.moe.z_weight", cfg.moe.z_weight)):
            if w > 0 and not spec.reads_routers:
                raise ConfigError(key, f"{name} has routers align does not read (it reads those of "
                                  f"model=olmoe and model=gemma4_moe): there is no router loss to apply", w)
        return
    for key, w in (("model.moe.lb_weight", cfg.moe.lb_weight), ("model.moe.z_weight", cfg.moe.z_weight)):
        if w > 0:
            raise ConfigError(key, f"{name} builds a dense model: there is no router to regularize", w)
    if cfg.moe.experts is not None:
        raise ConfigError("model.moe.experts", f"{name} builds a dense model: it has no experts kernel",
                          cfg.moe.experts.value)
    if not cfg.moe.telemetry:
        raise ConfigError("model.moe.telemetry", f"{name} builds a dense model: there is no router "
                          "telemetry to turn off", False)


def token_id_tables(model: torch.nn.Module) -> dict[str, int]:
    """Every table indexed by token ids, by what sets its size: the input embedding, and Gemma-4's
    per-layer embeddings (`vocab_size_per_layer_input`, which can be smaller)."""
    emb = model.get_input_embeddings()
    tables = {"model.overrides.vocab_size": emb.num_embeddings}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding) and "embed_tokens" in name and m is not emb:
            tables[f"{name} (its config's vocabulary)"] = m.num_embeddings
    return tables


def build_model(cfg: ModelConfig, attention: AttentionConfig, tokenizer, device: Optional[torch.device] = None,
                init_on_device: bool = False, scalar_head: bool = False) -> BuiltModel:
    """`device` picks the attention backend; `init_on_device` also creates a random-init model there
    (a 7B model's init on the host costs a minute and its full fp32 size in host RAM). `scalar_head`: the
    causal LM's backbone under a scalar head (align/models/scalar_head.py), before LoRA wraps it."""
    spec = family_spec(cfg)
    attn = resolve_attention(spec, attention, _device_type(device))
    config = model_config(cfg, tokenizer)
    moe = moe_shape_of(spec, config)
    check_router_losses(cfg, moe)
    refusal = qlora_refusal(cfg, moe is not None and spec.fused_experts)
    if refusal:
        raise ConfigError("model.lora.qlora", refusal, True)
    if scalar_head:  # preflight refused it already; a Trainer built without preflight is refused here
        from align.models.scalar_head import head_refusal

        why = head_refusal(spec, "a scalar-head objective", cfg.lora.enabled)
        if why:
            raise ConfigError(*why)
    _, model_cls = spec.classes()
    if attn.resolved == AttnImpl.layered:
        from align.models.layered_attention import register

        register()
    kw = load_kwargs(cfg, attn, moe)
    loaded = None
    if cfg.pretrained:
        # Tensors are read from the mmapped safetensors and cast one by one to `dtype`: an fp32
        # checkpoint loaded as bf16 never holds an fp32 copy of the model.
        if cfg.lora.qlora:
            kw["quantization_config"] = bnb_config()
        model, loaded = load_checked(model_cls, cfg.pretrained, "model.pretrained", config=config,
                                     local_files_only=True, **kw)
    else:
        with torch.device(device) if init_on_device and device is not None else contextlib.nullcontext():
            model = model_cls._from_config(config, **kw)
    unread_stores = drop_unread_kv_stores(model)
    if scalar_head:
        from align.models.scalar_head import to_scalar_head

        model = to_scalar_head(model, spec, tokenizer.pad_token_id)
    lora_info = None
    if cfg.lora.enabled:
        model, lora_info = apply_lora(model, cfg)
    runtime = ModelRuntime.build(model, cfg, spec, moe)
    info = describe_model(model, cfg, attn, moe, lora_info, spec)
    info["kv_stores_dropped"] = unread_stores
    info["weights"] = None if loaded is None else loaded.record()
    return BuiltModel(model=model, info=info, runtime=runtime)


def drop_unread_kv_stores(model: torch.nn.Module) -> int:
    """Gemma-4's last layer of each attention type stores its keys and values for the layers that
    share them (`num_kv_shared_layers`), even when no layer does: a write nobody reads, and a second
    compiled graph per layer type (the store is a branch the block's guards see). With no sharing
    layer the stores are turned off; returns how many were (the manifest's `kv_stores_dropped`)."""
    attns = [m for m in model.modules() if hasattr(m, "store_full_length_kv")]
    if any(getattr(m, "is_kv_shared_layer", False) for m in attns):
        return 0
    stores = [m for m in attns if m.store_full_length_kv]
    for m in stores:
        m.store_full_length_kv = False
    return len(stores)


def checkpoint_dtype(pretrained: Optional[str]) -> Optional[str]:
    if not pretrained:
        return None
    try:
        d = json.loads((Path(pretrained) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return d.get("dtype") or d.get("torch_dtype") or (d.get("text_config") or {}).get("dtype")


def describe_model(model: torch.nn.Module, cfg: ModelConfig, attn: AttentionChoice, moe: Optional[MoEShape],
                   lora_info: Optional[dict[str, Any]], spec: Optional[FamilySpec] = None) -> dict[str, Any]:
    """What the model resolved to, read back from the built object, never from the request; `family` is
    the one built (under model=hf the checkpoint's), `family_requested` the composed one."""
    spec = spec or family_spec(cfg)
    mc = model.config
    counts = count_params(model, moe)
    resolved_attn = getattr(mc, "_attn_implementation", None)
    if resolved_attn != attn.hf_name:
        log.warning("attention: built with %s but the model resolved %s", attn.hf_name, resolved_attn)
    return {
        "family": spec.name.value,
        "family_requested": cfg.family.value,
        "model_type": getattr(mc, "model_type", None),
        "model_class": type(model.get_base_model() if hasattr(model, "get_base_model") else model).__name__,
        "preset": None if cfg.pretrained else cfg.preset.value,
        "pretrained": cfg.pretrained,
        "checkpoint_dtype": checkpoint_dtype(cfg.pretrained),
        "attn_implementation_requested": attn.requested.hf_name,
        "attn_implementation_resolved": resolved_attn,
        "attn_fallback_reason": attn.reason,
        "experts_implementation_requested": cfg.moe.experts.value if cfg.moe.experts else None,
        "experts_implementation_resolved": getattr(mc, "_experts_implementation", None) if moe else None,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "params_total": counts.total,
        "params_active": counts.active,
        "params_trainable": counts.trainable,
        "vocab_size": mc.vocab_size,
        "moe": None if moe is None else {
            "num_experts": moe.num_experts, "top_k": moe.top_k,
            "lb_weight_applied": cfg.moe.lb_weight, "z_weight_applied": cfg.moe.z_weight,
            "telemetry": cfg.moe.telemetry and spec.reads_routers,
        },
        "lora": lora_info,
        "attention_layers": layered_plan(mc) if resolved_attn == AttnImpl.layered.hf_name else None,
    }


__all__ = ["BuiltModel", "build_model", "describe_model", "load_kwargs", "config_kwargs", "preset_kwargs",
           "model_config", "LoraGate"]


def resolved_backends(model: Any, moe: bool) -> dict[str, Any]:
    """Read back from the built model (docs/pitfalls.md#3): `config._attn_implementation` and, for MoE,
    `config._experts_implementation`."""
    mc = getattr(model, "config", None)
    out = {}
    if mc is not None and getattr(mc, "_attn_implementation", None) is not None:
        out["attn_implementation_resolved"] = mc._attn_implementation
    if moe and mc is not None and getattr(mc, "_experts_implementation", None) is not None:
        out["experts_implementation_resolved"] = mc._experts_implementation
    return out
