"""Schemas of the model and attention groups."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from align.config.rules import _only, _read, _require

# ----------------------------------------------------------------------------------------- model


class Family(StrEnum):
    mistral = "mistral"
    olmoe = "olmoe"
    gemma4 = "gemma4"
    """Gemma-4 text model, dense MLP (presets: tiny, small, full = gemma-4-31B)."""
    gemma4_moe = "gemma4_moe"
    """Gemma-4 text model with its MoE block (enable_moe_block; full = gemma-4-26B-A4B)."""
    hf = "hf"
    """Any local transformers causal-LM checkpoint (`model.pretrained` required, no presets): a
    model_type one of the families above loads runs as that family; any other through the class
    transformers' AutoModelForCausalLM maps it to (align/models/family.py)."""


class Preset(StrEnum):
    tiny = "tiny"
    small = "small"
    full = "full"


class LoraExport(StrEnum):
    merged = "merged"
    """Only the merged model in `export/` (LoRA folded into the base weights)."""
    adapter = "adapter"
    """Only the PEFT adapter in `export/adapter/` (no merged weights are written)."""
    both = "both"
    """The merged model in `export/` and the PEFT adapter in `export/adapter/`."""


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
    apply it. What was applied is recorded in the manifest (docs/pitfalls.md#5)."""
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
    target_modules: Optional[list[str]] = None
    """Which linears get adapters, by name as peft matches them (a module's name, or the end of it
    after a dot: `q_proj`, `self_attn.o_proj`), chosen among the attention and dense-MLP
    `nn.Linear`s; a name that matches none of them is refused naming those the model has. null:
    all of them (`align.models.lora.discover_targets`). Routers, the LM head and fused experts are
    never offered."""
    export: LoraExport = LoraExport.both
    """What `trainer.export` writes for a LoRA run: `merged` (the HF model in `export/`), `adapter`
    (peft's adapter_config.json + adapter_model.safetensors in `export/adapter/`, for
    `PeftModel.from_pretrained(base, export/adapter)` on the model the run started from) or `both`."""

    def __post_init__(self) -> None:
        _require(self.r >= 1, "model.lora.r", "must be >= 1", self.r)
        _require(self.alpha > 0, "model.lora.alpha", "must be > 0", self.alpha)
        _require(0 <= self.dropout < 1, "model.lora.dropout", "must be in [0, 1)", self.dropout)
        _require(self.gate_steps >= 0, "model.lora.gate_steps", "must be >= 0 (0 disables the gate)", self.gate_steps)
        _require(self.enabled or not self.qlora, "model.lora.qlora", "needs model.lora.enabled=true", self.qlora)
        if self.target_modules is not None:
            _require(bool(self.target_modules) and all(isinstance(t, str) and t.strip() for t in self.target_modules),
                     "model.lora.target_modules", "must be a non-empty list of module names (or null: all "
                     "attention and dense-MLP linears)", self.target_modules)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        if self.enabled:
            return {}
        return {f.name: f"ignored unless {key}.enabled=true" for f in dataclasses.fields(self) if f.name != "enabled"}


@dataclass
class ModelConfig:
    family: Family = Family.mistral
    """Model family: the transformers class that is built (no align model code). hf: any local causal-LM
    checkpoint (`pretrained` required); the family its model_type picks, else the class transformers
    maps it to (the manifest's `model.family` records which)."""
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
        _require(self.family != Family.hf or bool(self.pretrained), "model.pretrained",
                 "model=hf needs a checkpoint dir: set model.pretrained=<local HF checkpoint dir with config.json>",
                 self.pretrained)
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
    auto = "auto"
    """The family's choice (`AUTO_ATTENTION`): layered for Gemma-4, sdpa for the rest."""
    layered = "layered"
    """Per layer type (align/models/layered_attention.py): matmul attention (`chunked_attention`) for
    head dims flash does not take, transformers' sdpa path otherwise."""

    @property
    def hf_name(self) -> str:
        """The `attn_implementation` string transformers expects (layered: the name align registers)."""
        return {"sdpa": "sdpa", "eager": "eager", "flex": "flex_attention", "flash": "flash_attention_2",
                "layered": "align_layered", "auto": "auto"}[self.value]


AUTO_ATTENTION = {Family.gemma4: AttnImpl.layered, Family.gemma4_moe: AttnImpl.layered}
"""What attention=auto picks per family (the rest: sdpa); what was measured for it, per layer type,
and what was not yet: docs/performance.md#gemma-4-26b-a4b-lora."""


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
    implementation: AttnImpl = AttnImpl.auto
    """Requested attention backend; auto: the family's choice (`AUTO_ATTENTION`: layered for Gemma-4,
    sdpa otherwise). The resolved one (`config._attn_implementation`) is recorded, and under layered
    what each layer type runs (the manifest's `model.attention_layers`)."""
    fallback: Fallback = Fallback.refuse
    """refuse: a backend the family or machine cannot run fails preflight. allow: fall back to the
    library's choice, log it loudly and record both."""
    sdpa_kernels: list[SdpaKernel] = field(
        default_factory=lambda: [SdpaKernel.flash, SdpaKernel.efficient, SdpaKernel.cudnn, SdpaKernel.math])
    """With implementation=sdpa (or layered, auto: their sdpa calls): the kernels torch may pick, in
    priority order, applied around every forward AND backward (activation checkpointing recomputes
    attention there); the first that supports the call runs. `[]` keeps torch's own order, which on
    sm90 picks cuDNN: it builds a plan per new shape, and ragged batches keep making new shapes. What
    flash first was worth is in docs/performance.md. The kernel that ran is recorded from the
    profiler on GPU."""

    def chosen(self, family: Family) -> AttnImpl:
        """The backend this config names for `family`: auto replaced by the family's choice."""
        if self.implementation != AttnImpl.auto:
            return self.implementation
        return AUTO_ATTENTION.get(family, AttnImpl.sdpa)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        sdpa_users = [AttnImpl.sdpa, AttnImpl.layered, AttnImpl.auto]
        return _read({"sdpa_kernels": _only(key, self.implementation, sdpa_users)})
