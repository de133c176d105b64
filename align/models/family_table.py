"""The family table: which transformers classes a family uses, its size presets, where its routers are.

A preset is a dict of config-class kwargs (names are checked against the installed config class in
preflight, `align.run.model_checks`). `vocab_size` comes from the preset when it gives one (the `full`
presets: the real embedding size) and from the tokenizer otherwise; special token ids always come
from the tokenizer.

Sources of the `full` dimensions (no weights are downloaded; the dims are pinned by parameter counts
in tests/unit/models/test_registry.py):
- Mistral-7B-v0.3: the public config.json of mistralai/Mistral-7B-v0.3 (vocab 32768, rope_theta 1e6,
  no sliding window); the meta-device build has 7,248,023,552 parameters, the published count.
- OLMoE-1B-7B-0125: transformers' `OlmoeConfig` defaults (documented as the OLMoE-1B-7B shape) with
  the checkpoint's expert width 1024 (`intermediate_size`); 6,919,161,856 parameters, the count that
  allenai/OLMoE-1B-7B-0125's safetensors index gives (its `total_size` over 4 bytes of fp32).
- Gemma-4 26B-A4B and 31B: the `text_config` of google/gemma-4-26B-A4B-it and google/gemma-4-31B-it
  as quoted by several public repositories (found with the code search) and consistent with
  transformers' own `Gemma4TextConfig.base_model_ep_plan` comment ("num_global_key_value_heads=2" for
  26B-A4B). The 26B-A4B build has 25.2B text parameters, 3.8B active per token (Google: 3.8B active).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from align.config import AttnImpl, Family

if TYPE_CHECKING:  # preflight reads the presets and class paths without importing torch
    import torch


# ------------------------------------------------------------------------------------ MoE layout


@dataclass(frozen=True)
class RouterTap:
    """Where one MoE layer's routing decision can be read, without touching the model's code:
    forward hooks on `logits_module` (router logits, pre-softmax) and `index_module` (top-k ids)."""

    layer: int
    """Decoder layer index (from the module path `...layers.{i}...`)."""
    logits_module: torch.nn.Module
    logits_of: Callable[[Any], torch.Tensor]
    index_module: torch.nn.Module
    index_of: Callable[[Any], torch.Tensor]


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _layer_of(name: str) -> int:
    m = _LAYER.search(name + ".")
    if not m:
        raise ValueError(f"router module {name!r} is not under a `layers.<i>` module")
    return int(m.group(1))


def _olmoe_taps(model: torch.nn.Module) -> list[RouterTap]:
    from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter

    # OlmoeTopKRouter.forward returns (router_logits, router_scores, router_indices).
    return [RouterTap(_layer_of(n), m, lambda out: out[0], m, lambda out: out[2])
            for n, m in model.named_modules() if isinstance(m, OlmoeTopKRouter)]


def _gemma4_taps(model: torch.nn.Module) -> list[RouterTap]:
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRouter

    # Gemma4TextRouter returns (probabilities, top_k_weights, top_k_index); its logits are the
    # output of its `proj` linear, which is what softmax and top-k act on.
    return [RouterTap(_layer_of(n), m.proj, lambda out: out, m, lambda out: out[2])
            for n, m in model.named_modules() if isinstance(m, Gemma4TextRouter)]


@dataclass(frozen=True)
class MoEShape:
    num_experts: int
    top_k: int


def _olmoe_shape(config) -> Optional[MoEShape]:
    return MoEShape(config.num_experts, config.num_experts_per_tok)


def _gemma4_shape(config) -> Optional[MoEShape]:
    if not getattr(config, "enable_moe_block", False):
        return None
    return MoEShape(config.num_experts, config.top_k_experts)


def _dense(config) -> Optional[MoEShape]:
    return None


def _no_routers(model: torch.nn.Module) -> list[RouterTap]:
    return []


# ---------------------------------------------------------------------------------------- table


@dataclass(frozen=True)
class FamilySpec:
    name: Family
    config_class: str
    """Import path ("module:qualname") of the transformers config class."""
    model_class: str
    """Import path of the model class. Paths, not classes: importing transformers' models costs
    seconds, and preflight reads their signatures from align.core.signatures' cache instead."""
    presets: dict[str, dict[str, Any]]
    attention: frozenset[AttnImpl] = field(
        default_factory=lambda: frozenset(AttnImpl) - {AttnImpl.layered, AttnImpl.auto})
    """Attention backends the family's transformers class supports at all (the machine may still
    lack one). Pinned against the class's `_supports_*` flags by a test; `layered` is align's own
    (its rules were measured on Gemma-4's mixed layer types only); `auto` names no backend (it
    resolves to one of these first, `AttentionConfig.chosen`)."""
    moe_shape: Callable[[Any], Optional[MoEShape]] = _dense
    """(experts, top-k) read from a model config; None for a dense model."""
    router_taps: Callable[[torch.nn.Module], list[RouterTap]] = _no_routers
    """The routers of a built model, in layer order."""
    fused_experts: bool = False
    """Expert weights are fused 3-D parameters (not nn.Linear): no LoRA on them, no 4-bit base."""
    extra_config_kwargs: frozenset[str] = frozenset()
    """Kwargs the config class consumes in `__post_init__` although its signature does not list them."""
    model_type: str = ""
    """The `model_type` a checkpoint's config.json gives for this family (the config class's own; pinned by
    a test), checked before any weight loads (align.models.checkpoint_fit)."""
    checkpoint_moe: Optional[bool] = None
    """Whether the model is MoE, for a family without presets (`model=hf`'s generic spec,
    align.models.family: its checkpoint's config.json says); None: the presets say."""

    def classes(self) -> tuple[type, type]:
        """(config class, model class), imported now."""
        from align.core.signatures import resolve

        return resolve(self.config_class), resolve(self.model_class)

    @property
    def architecture(self) -> str:
        """The model class's name, as a checkpoint's config.json `architectures` lists it."""
        return self.model_class.rpartition(":")[2].rpartition(".")[2]

    def fits(self, config: dict[str, Any]) -> bool:
        """Whether a checkpoint's config.json (a dict) is this family's: its model_type, and MoE or not
        as the family's presets are (Gemma-4's two families share a model_type)."""
        return config.get("model_type") == self.model_type and bool(self.moe_shape(_Attrs(config))) == self.is_moe

    @property
    def reads_routers(self) -> bool:
        """Whether align has router taps for this family (telemetry, router losses): olmoe and the Gemma-4
        families; not a dense family, nor `model=hf`'s generic spec, whose router modules align does not know."""
        return self.router_taps is not _no_routers

    @property
    def is_moe(self) -> bool:
        """Whether the family's presets are MoE (a pretrained config decides for itself: `moe_shape`)."""
        if self.checkpoint_moe is not None:
            return self.checkpoint_moe
        return self.moe_shape is not _dense and any(self.moe_shape(_Attrs(p)) for p in self.presets.values())


class _Attrs:
    """Attribute view of a preset dict, so `moe_shape` can read presets and configs alike."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)

    def __getattr__(self, name: str) -> Any:
        return None


def _gemma4_layer_types(n: int) -> list[str]:
    # Gemma-4's 5 sliding : 1 full pattern; the last layer is always full.
    return ["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)]


_MISTRAL = dict(
    tiny=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=4096, sliding_window=None),
    # ~270M parameters with the bundled 4k vocabulary: a GPU smoke in seconds per step.
    small=dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=20, num_attention_heads=16,
               num_key_value_heads=4, head_dim=64, max_position_embeddings=32768, sliding_window=None,
               rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
    # mistralai/Mistral-7B-v0.3
    full=dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
              sliding_window=None, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
)

_OLMOE = dict(
    tiny=dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, max_position_embeddings=4096),
    # ~440M parameters, OLMoE's routing shape (64 experts, top-8) at a smaller width.
    small=dict(hidden_size=1024, intermediate_size=256, num_hidden_layers=8, num_attention_heads=16,
               num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, max_position_embeddings=4096),
    # allenai/OLMoE-1B-7B-0125
    full=dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
              max_position_embeddings=4096, rms_norm_eps=1e-5, norm_topk_prob=False, clip_qkv=None,
              rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}),
)

_GEMMA4_FULL_COMMON = dict(
    vocab_size=262144, head_dim=256, global_head_dim=512, attention_k_eq_v=True, sliding_window=1024,
    final_logit_softcapping=30.0, hidden_size_per_layer_input=0, max_position_embeddings=262144,
    rms_norm_eps=1e-6, tie_word_embeddings=True,
)

_GEMMA4 = dict(
    # Per-layer embeddings (PLE) on, as in the small Gemma-4 checkpoints: exercises that path on CPU.
    tiny=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, sliding_window=32, max_position_embeddings=4096,
              hidden_size_per_layer_input=16,
              layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]),
    # ~260M parameters, the 31B's layout (k=v global layers, wide global heads) at a small width.
    small=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=8,
               num_key_value_heads=4, head_dim=128, global_head_dim=256, num_global_key_value_heads=2,
               attention_k_eq_v=True, sliding_window=512, hidden_size_per_layer_input=0,
               max_position_embeddings=32768, final_logit_softcapping=30.0, layer_types=_gemma4_layer_types(12)),
    # google/gemma-4-31B (text)
    full=dict(_GEMMA4_FULL_COMMON, hidden_size=5376, intermediate_size=21504, num_hidden_layers=60,
              num_attention_heads=32, num_key_value_heads=16, num_global_key_value_heads=4,
              layer_types=_gemma4_layer_types(60)),
)

_GEMMA4_MOE = dict(
    # The 26B-A4B structure (dense MLP beside an MoE block, k=v global layers) in miniature.
    tiny=dict(hidden_size=128, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
              attention_k_eq_v=True, sliding_window=32, max_position_embeddings=4096, hidden_size_per_layer_input=0,
              enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
              layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]),
    # ~330M parameters.
    small=dict(hidden_size=1024, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
               num_key_value_heads=4, head_dim=128, global_head_dim=256, num_global_key_value_heads=2,
               attention_k_eq_v=True, sliding_window=512, hidden_size_per_layer_input=0,
               max_position_embeddings=32768, final_logit_softcapping=30.0, enable_moe_block=True,
               num_experts=32, top_k_experts=4, moe_intermediate_size=512, layer_types=_gemma4_layer_types(8)),
    # google/gemma-4-26B-A4B (text)
    full=dict(_GEMMA4_FULL_COMMON, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30,
              num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=2,
              enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
              layer_types=_gemma4_layer_types(30)),
)

# Gemma4TextConfig.__post_init__ pops these from **kwargs (transformers 5.24,
# models/gemma4/configuration_gemma4.py) although its signature does not name them.
_GEMMA4_EXTRA = frozenset({"global_head_dim", "num_global_key_value_heads"})

# Gemma-4 is text-only: AutoModelForCausalLM maps `gemma4` to the multimodal class, which refuses
# flash attention (docs/pitfalls.md#4); the text model is built from its text config directly.
_GEMMA4_CLASSES = dict(config_class="transformers:Gemma4TextConfig",
                       model_class="transformers.models.gemma4.modeling_gemma4:Gemma4ForCausalLM",
                       model_type="gemma4_text")

_GEMMA4_ATTENTION = frozenset(AttnImpl) - {AttnImpl.auto}

FAMILIES: dict[Family, FamilySpec] = {
    Family.mistral: FamilySpec(name=Family.mistral, config_class="transformers:MistralConfig",
                               model_class="transformers:MistralForCausalLM", presets=_MISTRAL,
                               model_type="mistral"),
    Family.olmoe: FamilySpec(
        name=Family.olmoe,
        config_class="transformers:OlmoeConfig",
        model_class="transformers:OlmoeForCausalLM",
        model_type="olmoe",
        presets=_OLMOE,
        attention=frozenset({AttnImpl.sdpa, AttnImpl.eager, AttnImpl.flash}),  # no flex (docs/pitfalls.md#4)
        moe_shape=_olmoe_shape,
        router_taps=_olmoe_taps,
        fused_experts=True,
    ),
    Family.gemma4: FamilySpec(
        name=Family.gemma4, **_GEMMA4_CLASSES, presets=_GEMMA4, moe_shape=_gemma4_shape, attention=_GEMMA4_ATTENTION,
        router_taps=_gemma4_taps, fused_experts=True, extra_config_kwargs=_GEMMA4_EXTRA,
    ),
    Family.gemma4_moe: FamilySpec(
        name=Family.gemma4_moe, **_GEMMA4_CLASSES, presets=_GEMMA4_MOE, moe_shape=_gemma4_shape,
        attention=_GEMMA4_ATTENTION,
        router_taps=_gemma4_taps, fused_experts=True, extra_config_kwargs=_GEMMA4_EXTRA,
    ),
}


@dataclass
class ParamCount:
    total: int
    active: int
    """Parameters a token passes through: all but the (E - k) / E share of the expert weights."""
    trainable: int
    experts: int


def count_params(model: torch.nn.Module, moe: Optional[MoEShape], trainable: Optional[int] = None) -> ParamCount:
    total = experts = grad = 0
    for name, p in model.named_parameters():
        n = p.numel()
        total += n
        grad += n if p.requires_grad else 0
        if moe is not None and ".experts." in f".{name}.":
            experts += n
    active = total if moe is None else total - round(experts * (moe.num_experts - moe.top_k) / moe.num_experts)
    return ParamCount(total, active, grad if trainable is None else trainable, experts)
