"""The family table: presets build to the right sizes and are accepted by the installed config classes."""

from __future__ import annotations

import pytest

from align.config import AttnImpl, Family, ModelConfig, Preset
from align.models.family_table import FAMILIES, count_params
from align.plan.memory import meta_model

ALL = [(f, p) for f in FAMILIES for p in Preset]


@pytest.mark.parametrize("family,preset", ALL, ids=[f"{f.value}-{p.value}" for f, p in ALL])
def test_every_preset_builds_on_meta_and_its_kwargs_are_accepted_by_name(family, preset):
    model, config = meta_model(ModelConfig(family=family, preset=preset))  # check_names runs inside
    spec = FAMILIES[family]
    assert type(model).__name__ == spec.classes()[1].__name__
    counts = count_params(model, spec.moe_shape(config))
    if preset == Preset.tiny:
        assert 0.5e6 < counts.total < 5e6, counts  # "a few M"
    elif preset == Preset.small:
        assert 1.5e8 < counts.total < 7e8, counts  # "a few hundred M"
    assert (counts.active < counts.total) == (spec.moe_shape(config) is not None)


def test_full_presets_have_the_published_parameter_counts():
    # Mistral-7B-v0.3 and OLMoE-1B-7B-0125: exact published counts (the latter from the checkpoint
    # safetensors index). Gemma-4: 26B-A4B is "3.8B active"; 31B is ~30.7B text parameters.
    def counts(f):
        m, c = meta_model(ModelConfig(family=f, preset=Preset.full))
        return count_params(m, FAMILIES[f].moe_shape(c))

    assert counts(Family.mistral).total == 7_248_023_552
    olmoe = counts(Family.olmoe)
    assert olmoe.total == 6_919_161_856
    assert abs(olmoe.active - 1.28e9) < 0.01e9  # "1B active": 8 of 64 experts per token
    g26 = counts(Family.gemma4_moe)
    assert 25.0e9 < g26.total < 25.5e9 and 3.7e9 < g26.active < 3.9e9, g26
    assert 30.5e9 < counts(Family.gemma4).total < 31.0e9


def test_gemma4_families_build_the_text_only_causal_lm_and_only_the_moe_one_has_routers(build):
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    dense, moe = build(Family.gemma4), build(Family.gemma4_moe)
    assert type(dense.model) is Gemma4ForCausalLM and type(moe.model) is Gemma4ForCausalLM
    assert dense.info["moe"] is None and not FAMILIES[Family.gemma4].router_taps(dense.model)
    taps = FAMILIES[Family.gemma4_moe].router_taps(moe.model)
    assert [t.layer for t in taps] == list(range(4)) and moe.info["moe"]["num_experts"] == 8


def test_the_gemma4_extra_config_kwargs_are_not_silently_dropped():
    # Allowed by name although the signature lacks them: prove they take effect, else the allow-list
    # would hide exactly the silent no-op the name check exists to catch.
    from transformers import Gemma4TextConfig

    base = dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], attention_k_eq_v=True,
                num_key_value_heads=4)
    c = Gemma4TextConfig(**base, global_head_dim=64, num_global_key_value_heads=1)
    assert c.per_layer_config[1].head_dim == 64 and c.per_layer_config[1].num_key_value_heads == 1
    assert Gemma4TextConfig(**base).per_layer_config[1].head_dim == 512


def test_unknown_config_kwarg_is_refused_by_name_not_swallowed():
    from align.errors import ConfigError

    with pytest.raises(ConfigError, match="model.overrides.*hiden_size"):
        meta_model(ModelConfig(family=Family.mistral, overrides={"hiden_size": 64}))
    with pytest.raises(ConfigError, match="model.overrides.*moe_experts"):
        meta_model(ModelConfig(family=Family.gemma4_moe, overrides={"moe_experts": 4}))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_attention_table_matches_the_transformers_class_flags(family):
    spec = FAMILIES[family]
    cls = spec.classes()[1]
    flags = {AttnImpl.sdpa: cls._supports_sdpa, AttnImpl.flex: cls._supports_flex_attn,
             AttnImpl.flash: cls._supports_flash_attn, AttnImpl.eager: True}
    # layered is align's (transformers' sdpa plus its own chunked kernel, registered by name): Gemma-4 only
    layered = {AttnImpl.layered} if family in (Family.gemma4, Family.gemma4_moe) else set()
    assert {a for a, ok in flags.items() if ok} | layered == set(spec.attention)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_checkpoint_model_type_and_architecture_are_the_transformers_classes_own(family):
    # what preflight holds a checkpoint's config.json against (align.models.checkpoint_fit.family_problem)
    spec = FAMILIES[family]
    config_cls, model_cls = spec.classes()
    assert spec.model_type == config_cls.model_type and spec.architecture == model_cls.__name__
