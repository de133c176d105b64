"""The interface's values: a SamplingSpec refuses what it cannot mean, naming the key; the mode resolves
per device; derived seeds are a pure function of (seed, position)."""

from __future__ import annotations

import pytest

from align.errors import ConfigError
from align.generation import EngineConfig, GenerateMode, SamplingSpec, derive_seed, resolve_mode


@pytest.mark.parametrize("kw, key", [
    ({"max_new_tokens": 0}, "sampling.max_new_tokens"),
    ({"temperature": -0.1}, "sampling.temperature"),
    ({"top_p": 0.0}, "sampling.top_p"),
    ({"top_p": 1.5}, "sampling.top_p"),
    ({"top_k": -1}, "sampling.top_k"),
    ({"n": 0}, "sampling.n"),
    ({"seed": -1}, "sampling.seed"),
    ({"temperature": 0, "top_p": 0.9}, "sampling.top_p"),
    ({"temperature": 0, "top_k": 5}, "sampling.top_p"),
    ({"temperature": 0, "n": 4}, "sampling.n"),
    ({"stop_token_ids": (2, -1)}, "sampling.stop_token_ids"),
])
def test_sampling_spec_refuses_values_it_cannot_mean(kw, key):
    with pytest.raises(ConfigError) as e:
        SamplingSpec(**kw)
    assert e.value.key == key


def test_sampling_spec_defaults_and_greedy():
    s = SamplingSpec()
    assert (s.temperature, s.top_p, s.top_k, s.n, s.stop_token_ids, s.greedy) == (1.0, 1.0, 0, 1, None, False)
    assert SamplingSpec(temperature=0).greedy
    assert SamplingSpec(stop_token_ids=[7, 8]).stop_token_ids == (7, 8)


@pytest.mark.parametrize("kw, key", [({"batch_size": 0}, "generation.batch_size"),
                                     ({"pad_to_multiple_of": 0}, "generation.pad_to_multiple_of")])
def test_engine_config_refuses_bad_sizes(kw, key):
    with pytest.raises(ConfigError) as e:
        EngineConfig(**kw)
    assert e.value.key == key


def test_mode_resolves_per_device():
    assert resolve_mode(GenerateMode.auto, "cuda") is GenerateMode.compiled
    assert resolve_mode(GenerateMode.auto, "cpu") is GenerateMode.dynamic
    assert resolve_mode(GenerateMode.static, "cpu") is GenerateMode.static
    with pytest.raises(ConfigError):
        resolve_mode(GenerateMode.compiled, "cpu")


def test_derived_seeds_are_pure_and_distinct():
    assert derive_seed(3, 0) == derive_seed(3, 0)
    assert len({derive_seed(3, 0), derive_seed(3, 1), derive_seed(4, 0), derive_seed(30)}) == 4
    assert all(0 <= derive_seed(s, b) < 2 ** 63 for s in range(5) for b in range(5))
