"""trainer.compile / optimizer.compile = auto (align/plan/compile_auto.py): on where the device is CUDA and
the configuration is a tested one, off on a CPU, with why."""

from __future__ import annotations

import pytest

from align.config import to_typed
from align.config.model import AttnImpl
from align.errors import ConfigError
from align.plan.compile_auto import resolve_compile
from align.run.cli import compose


def typed(*overrides: str):
    return to_typed(compose(["logger=none", *overrides]))


def test_the_default_is_auto_and_resolves_on_on_cuda_off_on_a_cpu_with_why():
    cfg = typed()
    assert cfg.trainer.compile == "auto" and cfg.optimizer.compile == "auto"
    on, rec = resolve_compile(cfg, "cuda")
    assert on.trainer.compile is True and on.optimizer.compile is True
    assert rec["trainer"] == {"requested": "auto", "resolved": True,
                              "why": "trainer.compile=auto resolved on: CUDA and a tested configuration"}
    off, rec = resolve_compile(cfg, "cpu")
    assert off.trainer.compile is False and off.optimizer.compile is False
    assert rec["trainer"]["resolved"] is False and "device cpu" in rec["trainer"]["why"]
    assert "device cpu" in rec["optimizer"]["why"]
    assert cfg.trainer.compile == "auto"  # the configured object is left as the user gave it


def _set(cfg, what: str):
    """One configuration auto must not compile (mutating the typed config: the resolver reads attributes)."""
    from align.config import OptimizerName, ParallelKind

    if what == "overlap":
        cfg.optimizer.overlap = True
    elif what == "ep":
        cfg.parallel.kind = ParallelKind.ep
    elif what == "eager":
        cfg.attention.implementation = AttnImpl.eager
    elif what == "lora":
        cfg.model.lora.enabled = True
    elif what == "grpo":  # generation_dtype=auto: a bf16 copy on CUDA keeps decoding out of the blocks
        cfg = typed("objective=grpo", "reward=gsm8k", "data=gsm8k_prompts")
    elif what == "grpo_same":
        cfg = typed("objective=grpo", "reward=gsm8k", "data=gsm8k_prompts", "objective.generation_dtype=same")
    elif what == "adamw8bit":
        cfg.optimizer.name = OptimizerName.adamw8bit
    elif what == "gemma4":
        cfg = typed("model=gemma4")
    elif what == "gemma4_moe_lora":
        cfg = typed("model=gemma4_moe", "model.lora.enabled=true")
    elif what == "fsdp":
        cfg.parallel.kind = ParallelKind.fsdp
    return cfg


@pytest.mark.parametrize("what, blocks, step, said", [
    ("overlap", False, True, "optimizer.overlap=true"),
    ("ep", False, False, "parallel=ep"),
    ("eager", False, True, "attention=eager"),
    ("lora", True, False, "model.lora.enabled=true"),  # compiled LoRA blocks: tests/integration/test_compile.py
    ("grpo", True, True, "trainer.compile=auto resolved on"),
    ("grpo_same", False, True, "objective=grpo with objective.generation_dtype resolved to same"),
    ("adamw8bit", True, False, "optimizer=adamw8bit"),
    ("fsdp", True, False, "parallel=fsdp"),
    ("gemma4", False, True, "model=gemma4"),
    ("gemma4_moe_lora", True, False, "trainer.compile=auto resolved on"),  # auto attention is layered, covered
])
def test_auto_on_cuda_is_on_only_inside_the_tested_configurations(what, blocks, step, said):
    cfg, rec = resolve_compile(_set(typed(), what), "cuda")
    assert (cfg.trainer.compile, cfg.optimizer.compile) == (blocks, step)
    whys = rec["trainer"]["why"] + rec["optimizer"]["why"]
    assert said in whys


@pytest.mark.parametrize("value", [True, False])
def test_an_explicit_switch_is_kept_as_configured(value):
    cfg, rec = resolve_compile(typed(f"trainer.compile={str(value).lower()}"), "cpu")
    word = str(value).lower()
    assert cfg.trainer.compile is value and rec["trainer"]["why"] == f"trainer.compile={word} as configured"


def test_a_switch_outside_true_false_auto_is_refused():
    with pytest.raises(ConfigError, match="must be true, false or auto"):
        typed("trainer.compile=yes")
    with pytest.raises(ConfigError, match="needs trainer.compile=false"):  # only an explicit true beside overlap
        typed("optimizer.overlap=true", "trainer.compile=true")
    assert typed("optimizer.overlap=true").trainer.compile == "auto"
