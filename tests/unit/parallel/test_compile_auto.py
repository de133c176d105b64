"""trainer.compile / optimizer.compile = auto (align.parallel.compile): on where the device is CUDA and the
configuration is a tested one, off on a CPU, with why; the cost of compiling is visible and the inductor
cache persists where the docs say."""

from __future__ import annotations

import pytest

from align.config import to_typed
from align.config.model import AttnImpl
from align.errors import ConfigError
from align.parallel.compile import (
    apply_cache_dir,
    expected_compiles_per_frame,
    frames_over,
    resolve_compile,
)
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


def test_the_inductor_cache_goes_to_a_persistent_default_unless_the_environment_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ALIGN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    rec = apply_cache_dir()
    assert rec == {"dir": str(tmp_path / "xdg" / "align" / "inductor"), "source": "$XDG_CACHE_HOME/align/inductor"}
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == rec["dir"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert apply_cache_dir() == {"dir": str(tmp_path / "mine"),
                                 "source": "$TORCHINDUCTOR_CACHE_DIR from the environment"}


def test_a_frame_that_compiles_more_graphs_than_expected_is_found():
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    assert expected_compiles_per_frame(True, True, None) == 2
    assert expected_compiles_per_frame(True, None, None) == 3
    assert expected_compiles_per_frame(True, True, None, variants=3) == 6  # Gemma-4: docs/performance.md
    assert expected_compiles_per_frame(True, False, None) is None
    assert expected_compiles_per_frame(False, None, 16) == 16

    def f(x):
        return x * 2

    g = torch.compile(f, backend="eager", dynamic=False)
    for n in (2, 3, 4):  # static shapes: a graph per shape
        g(torch.ones(n))
    assert frames_over(2) == [3]
    assert frames_over(3) == [] and frames_over(None) == []
    torch._dynamo.reset()


def test_the_first_step_and_the_compile_share_are_on_the_progress_line(caplog, monkeypatch):
    import logging

    import align.telemetry.progress as progress

    clock = iter([10.0, 11.5, 11.5])  # 10 s compiled before this run (an earlier job of the process)
    monkeypatch.setattr(progress, "compile_seconds", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="align"):
        p = progress.Progress(4, 0, True, 1)
        p.tty = False
        p.update({"step": 1, "loss": 2.0, "tokens_per_s": 100.0, "step_time_s": 3.25})
    err = "\n".join(r.getMessage() for r in caplog.records)
    assert "first step 3.2s (compiling 1.5s so far)" in err and "of the wall" in err


def test_the_compile_cost_counts_from_this_runs_start(monkeypatch):
    """dynamo's compile timer is per process: a sweep's second job (or a test after others) must not
    report the earlier jobs' compiles as its own (a GPU test read 238% of the wall)."""
    import align.telemetry.throughput as tp

    clock = iter([40.0, 42.0])
    monkeypatch.setattr(tp, "compile_seconds", lambda: next(clock))
    t = tp.Throughput.__new__(tp.Throughput)
    t._compile0, t._steps, t._first_s, t._all_s = tp.compile_seconds(), 2, 3.0, 8.0
    cost = t.compile_cost()
    assert cost["throughput/compile_s"] == 2.0 and cost["throughput/compile_share"] == 0.25
