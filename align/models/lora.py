"""LoRA with peft: targets discovered from the model, QLoRA for dense families, the inert-adapter gate.

Targets are every `nn.Linear` whose parent is an attention module or a dense MLP module (class names
ending in Attention / MLP in transformers' modeling files). Routers, per-layer-input projections and
the LM head are linears too but are left alone, and fused 3-D expert weights are not `nn.Linear` at
all: both are listed in the manifest as not adapted, so nobody believes the experts were tuned.
`model.lora.target_modules` narrows them to the names given (matched as peft matches a list: the
module's name or its end after a dot); a name matching no candidate is refused naming the candidates.
Every peft / bitsandbytes kwarg is built as a dict and checked by name against the installed
signature first (`check_names`).
"""

from __future__ import annotations

import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

from align.config import LoraConfig, LoraExport, ModelConfig
from align.errors import AlignError, ConfigError

_LAYER_NUM = re.compile(r"\.(\d+)\.")


def check_names(fn: Callable, kwargs: dict[str, Any], key: str, extra: Iterable[str] = ()) -> None:
    """Every key must be a NAMED parameter of `fn` as installed (a **kwargs catch-all does not count:
    it is exactly where a misspelt name disappears silently)."""
    params = inspect.signature(fn).parameters
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} | set(extra)
    unknown = sorted(set(kwargs) - named)
    if unknown:
        raise ConfigError(key, f"{getattr(fn, '__qualname__', fn)} (installed) does not accept {unknown}; "
                          f"it accepts: {', '.join(sorted(named))}")


def _pattern(name: str) -> str:
    return _LAYER_NUM.sub(".*.", name)


@dataclass
class LoraTargets:
    modules: list[str] = field(default_factory=list)
    """Full module names that get adapters."""
    in_out: list[tuple[int, int]] = field(default_factory=list)
    """(in_features, out_features) of each target, for parameter counts without peft."""
    not_adapted_linears: list[str] = field(default_factory=list)
    """Linears deliberately left alone (router, LM head, per-layer-input projections), as patterns."""
    skipped_fused: list[str] = field(default_factory=list)
    """Fused expert parameters (3-D, not nn.Linear): never adapted, reported."""

    def summary(self) -> dict[str, Any]:
        return {
            "targets": sorted({_pattern(m) for m in self.modules}),
            "target_modules": len(self.modules),
            "not_adapted_linears": sorted(set(self.not_adapted_linears)),
            "skipped_fused_expert_params": sorted(set(self.skipped_fused)),
        }

    def lora_params(self, r: int) -> int:
        return sum(r * (i + o) for i, o in self.in_out)


def _role(parent: torch.nn.Module) -> str | None:
    cls = type(parent).__name__
    if "Attention" in cls:
        return "attention"
    if cls.endswith("MLP"):
        return "mlp"
    return None


def _matches(module: str, name: str) -> bool:
    return module == name or module.endswith("." + name)


def discover_targets(model: torch.nn.Module, names: Optional[list[str]] = None) -> LoraTargets:
    """The attention and dense-MLP linears of `model`; with `names` (model.lora.target_modules) only
    those matching one of them, and a name matching none is refused with the candidates' names."""
    modules = dict(model.named_modules())
    t = LoraTargets()
    candidates: list[str] = []
    for name, mod in modules.items():
        if isinstance(mod, torch.nn.Linear):
            parent = modules.get(name.rpartition(".")[0]) if "." in name else model
            if parent is not None and _role(parent):
                candidates.append(name)
            else:
                t.not_adapted_linears.append(_pattern(name))
    unknown = [n for n in names or [] if not any(_matches(c, n) for c in candidates)]
    if unknown:
        accepted = ", ".join(sorted({c.rpartition(".")[2] for c in candidates}))
        raise ConfigError("model.lora.target_modules", f"no attention or dense-MLP nn.Linear of {type(model).__name__} "
                          f"is named {unknown}; accepted: {accepted}")
    for name in candidates:
        if names is None or any(_matches(name, n) for n in names):
            t.modules.append(name)
            t.in_out.append((modules[name].in_features, modules[name].out_features))
        else:
            t.not_adapted_linears.append(_pattern(name))
    for name, p in model.named_parameters():
        if p.dim() == 3:
            t.skipped_fused.append(_pattern(name))
    return t


def lora_kwargs(cfg: LoraConfig, targets: LoraTargets) -> dict[str, Any]:
    return {"r": cfg.r, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout, "target_modules": targets.modules,
            "bias": "none", "task_type": "CAUSAL_LM"}


def bnb_kwargs() -> dict[str, Any]:
    return {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": torch.bfloat16}


def bnb_config():
    from transformers import BitsAndBytesConfig

    kw = bnb_kwargs()
    check_names(BitsAndBytesConfig, kw, "model.lora.qlora")
    return BitsAndBytesConfig(**kw)


def qlora_refusal(cfg: ModelConfig, is_moe_fused: bool) -> str | None:
    """Why QLoRA is refused for this model, or None (docs/pitfalls.md#21: not an escape hatch for MoE)."""
    if not cfg.lora.qlora:
        return None
    if is_moe_fused:
        return (f"QLoRA is refused for {cfg.family.value}: its experts are fused 3-D parameters, not nn.Linear, so "
                "bitsandbytes leaves them (most of the model) in full precision; use LoRA on a bf16 base")
    if not cfg.pretrained:
        return "QLoRA quantizes checkpoint weights while loading: set model.pretrained=<local HF dir>"
    return None


ADAPTER_DIR = "adapter"
"""Where the PEFT adapter goes inside the export directory (`export/adapter/`)."""


def adapter_base(cfg: ModelConfig) -> str:
    """The model an exported adapter applies to (`PeftModel.from_pretrained(base, export/adapter)`)."""
    if cfg.pretrained and cfg.lora.qlora:
        return (f"{cfg.pretrained} (model.pretrained); the trained function is that base quantized as in training "
                "(align.models.lora.bnb_config); at full precision it is what export/ merges into")
    if cfg.pretrained:
        return f"{cfg.pretrained} (model.pretrained)"
    return (f"random init of preset {cfg.preset.value} (no checkpoint): the weights the run started from, rebuilt "
            "by align.models.adapter.base_model from the run's config and trainer.seed")


def export_record(cfg: ModelConfig) -> dict[str, Any]:
    """The LoRA entry's `export`: what `trainer.export` writes for this run and where (every key present;
    null where `model.lora.export` writes no such thing)."""
    adapter = cfg.lora.export != LoraExport.merged
    return {"choice": cfg.lora.export.value,
            "merged_dir": "export" if cfg.lora.export != LoraExport.adapter else None,
            "adapter_dir": f"export/{ADAPTER_DIR}" if adapter else None,
            "adapter_base": adapter_base(cfg) if adapter else None}


def apply_lora(model: torch.nn.Module, cfg: ModelConfig) -> tuple[torch.nn.Module, dict[str, Any]]:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model, prepare_model_for_kbit_training

    targets = discover_targets(model, cfg.lora.target_modules)
    if not targets.modules:
        raise ConfigError("model.lora.enabled", f"found no attention or dense-MLP nn.Linear in {type(model).__name__}")
    if cfg.lora.qlora:
        kw = {"use_gradient_checkpointing": False}
        check_names(prepare_model_for_kbit_training, kw, "model.lora.qlora")
        model = prepare_model_for_kbit_training(model, **kw)
    kw = lora_kwargs(cfg.lora, targets)
    check_names(PeftLoraConfig, kw, "model.lora")
    with warnings.catch_warnings():
        # peft's PeftModel.__init__ reads `model.is_gradient_checkpointing`, the property transformers
        # deprecated for `is_activation_checkpointing`: peft's call, not align's; the value it reads is
        # unchanged (docs/pitfalls.md#25).
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        model = get_peft_model(model, PeftLoraConfig(**kw))
    info = {"r": cfg.lora.r, "alpha": cfg.lora.alpha, "dropout": cfg.lora.dropout, "qlora": cfg.lora.qlora,
            "gate_steps": cfg.lora.gate_steps, "target_modules_requested": cfg.lora.target_modules,
            **targets.summary(), "export": export_record(cfg)}
    return model, info


def lora_b_params(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if "lora_B" in n]


class InertAdapterError(AlignError):
    """LoRA adapters that never moved: the run trains nothing and would export the base model."""


class LoraGate:
    """After `gate_steps` optimizer steps every lora_B must have moved from its zero init."""

    def __init__(self, model: torch.nn.Module, gate_steps: int) -> None:
        self.model = model
        self.gate_steps = gate_steps
        self.passed: bool | None = None

    def check(self, step: int) -> None:
        if self.gate_steps <= 0 or step != self.gate_steps:
            return
        # Read now, not at build: fully_shard (align/parallel/fsdp.py) registers new sharded
        # parameters, and the ones the build saw stay zero whatever the optimizer does.
        self.params = lora_b_params(self.model)
        moved = torch.stack([_local(p).ne(0).any().float() for _, p in self.params]) if self.params else torch.ones(0)
        if torch.distributed.is_available() and torch.distributed.is_initialized() and moved.numel():
            torch.distributed.all_reduce(moved, op=torch.distributed.ReduceOp.MAX)  # a shard may be all zero
        inert = [n for (n, _), m in zip(self.params, moved.tolist()) if m == 0]
        self.passed = not inert and bool(self.params)
        if not self.params:
            raise InertAdapterError("LoRA gate: model.lora.enabled but the model has no lora_B parameters")
        if inert:
            raise InertAdapterError(
                f"LoRA gate: after {step} optimizer steps {len(inert)} of {len(self.params)} lora_B matrices are still "
                f"exactly zero (first: {inert[0]}): the adapters are not training (frozen, lr 0, or no gradient "
                f"reaches them); halting instead of exporting the base model (model.lora.gate_steps={self.gate_steps})")


def _local(p: torch.Tensor) -> torch.Tensor:
    t = p.detach()
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: this rank's shard
