"""Every experiment under conf/experiment/ (bench arms included) composes with the train config,
converts to the typed config, names only model-config fields the family's config class has, and ends
up with every value its own file sets. A knob that no longer exists fails here, not on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from align.config import TrainConfig, to_typed
from align.run.cli import CONF_DIR

EXPERIMENT_DIR = CONF_DIR / "experiment"
EXPERIMENTS = sorted(p.relative_to(EXPERIMENT_DIR).with_suffix("").as_posix() for p in EXPERIMENT_DIR.rglob("*.yaml"))


def leaves(node, prefix: str = ""):
    """(dotted key, value) of every leaf a config file sets; an empty mapping or a list is one leaf."""
    if isinstance(node, DictConfig) and len(node):
        for k in node:
            yield from leaves(node[k], f"{prefix}{k}.")
    elif prefix:
        yield prefix[:-1], OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node


def test_the_glob_found_the_bench_arms():
    assert {"smoke", "bench/dense_best", "bench/dense_eager", "bench/moe_fast", "bench/moe_ac_32k"} <= set(EXPERIMENTS)
    assert len(EXPERIMENTS) >= 40


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_validates_and_keeps_its_values(name, compose, tokenizer):
    from align.models.build import model_config

    cfg = compose([f"experiment={name}"])
    typed = to_typed(cfg)
    assert isinstance(typed, TrainConfig)
    model_config(typed.model, tokenizer)  # checks model.overrides names against the config class

    own = OmegaConf.load(EXPERIMENT_DIR / f"{name}.yaml")
    own.pop("defaults", None)
    for key, value in leaves(own):
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if isinstance(got, (DictConfig, ListConfig)) else got
        assert got == value, f"{name}: {key} composes to {got!r}, the file sets {value!r}"


def test_no_session_named_scripts_remain():
    scripts = Path(CONF_DIR).parent / "scripts"
    assert not sorted(p.name for p in scripts.glob("gpu_*round*.sh"))
