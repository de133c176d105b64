"""trainer.compile_memory_budget (align.parallel.compile.apply_memory_budget): it reaches the partitioner
of compiled graphs (fewer saved bytes, the same gradients), a run sets it or torch's default before
anything compiles and records what torch reads back, the memory estimate counts it, and bad values are
refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch._functorch.config as functorch_config

from align.config import to_typed
from align.errors import ConfigError
from align.parallel.compile import MEMORY_BUDGET, apply_compile, apply_memory_budget
from align.plan.compile_auto import resolve_compile
from align.run.cli import compose


def typed(*overrides: str):
    return to_typed(compose(["logger=none", "allow_dirty=true", *overrides]))


def applied(cfg, device_type: str):
    """What a run's build sets for `cfg` on `device_type`: the switches resolved (the job's plan), then applied."""
    return apply_compile(resolve_compile(cfg, device_type)[0])


@pytest.fixture(autouse=True)
def _restore_torch_default():
    yield
    apply_memory_budget(None)


def _block(x, w1, w2):
    h = torch.nn.functional.gelu(x @ w1)
    return ((h * torch.sigmoid(h) + h.sin()) @ w2).cos().sum()


def _saved_bytes_and_grads(budget):
    """Fwd+bwd of a compiled function (aot_eager: the partitioner runs, no code is generated) with
    dynamic shapes, as the decoder blocks compile: the bytes autograd saved, and the gradients."""
    apply_memory_budget(budget)
    torch._dynamo.reset()
    fn = torch.compile(_block, backend="aot_eager", dynamic=True)
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=gen, requires_grad=True) for s in ((64, 32), (32, 128), (128, 16))]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        fn(*args).backward()
    return sum(saved), [a.grad for a in args]


def test_the_budget_reaches_the_partitioner_and_changes_what_is_saved_not_the_gradients():
    full, grads = _saved_bytes_and_grads(None)
    inputs_only, grads0 = _saved_bytes_and_grads(0.0)
    half, grads_half = _saved_bytes_and_grads(0.5)
    assert inputs_only == (64 * 32 + 32 * 128 + 128 * 16) * 4  # 0: only the graph's inputs, as checkpointing
    assert inputs_only < half < full
    for g, g0, gh in zip(grads, grads0, grads_half):
        torch.testing.assert_close(g0, g)
        torch.testing.assert_close(gh, g)


def test_a_compiling_run_sets_the_budget_or_torchs_default_and_records_what_torch_reads_back():
    rec = applied(typed("trainer.compile=true", "trainer.compile_memory_budget=0.3"), "cpu")
    assert getattr(functorch_config, MEMORY_BUDGET) == 0.3
    assert rec["memory_budget"] == {"requested": 0.3, "applied": 0.3, "why": "trainer.compile_memory_budget"}
    rec = applied(typed("trainer.compile=true", "trainer.compile_memory_budget=null"), "cpu")  # torch's
    assert getattr(functorch_config, MEMORY_BUDGET) == 1.0 and rec["memory_budget"]["requested"] is None
    rec = applied(typed(), "cpu")  # auto resolves off on a CPU: nothing compiles, no record
    assert rec["memory_budget"] is None


def test_a_torch_without_the_knob_refuses_a_budget_and_records_its_absence_otherwise(monkeypatch):
    import align.parallel.compile as compile_mod

    monkeypatch.setattr(compile_mod, "MEMORY_BUDGET", "a_knob_this_torch_lacks")
    with pytest.raises(ConfigError) as e:
        apply_memory_budget(0.5)
    assert e.value.key == "trainer.compile_memory_budget" and "a_knob_this_torch_lacks" in e.value.message
    assert apply_memory_budget(None) == {"requested": None, "applied": None,
                                         "why": "this torch has no a_knob_this_torch_lacks"}


@pytest.mark.parametrize("bad", ["-0.1", "1.5"])
def test_a_budget_outside_zero_to_one_is_refused(bad):
    with pytest.raises(ConfigError) as e:
        typed(f"trainer.compile_memory_budget={bad}")
    assert e.value.key == "trainer.compile_memory_budget"


def test_a_budget_without_compiled_blocks_is_refused_as_ignored():
    with pytest.raises(ConfigError) as e:
        typed("trainer.compile=false", "trainer.compile_memory_budget=0.5")
    assert e.value.key == "trainer.compile_memory_budget" and "compile" in e.value.message


def test_an_unresolved_auto_reaches_no_compile_or_estimate():
    from align.plan.memory import estimate_memory

    cfg = typed("experiment=bench/gemma4_lora_noac")
    assert cfg.trainer.compile_memory_budget == "auto"
    with pytest.raises(ValueError, match="compile_memory_budget='auto' reached the compile unresolved"):
        applied(cfg, "cuda")
    with pytest.raises(ValueError, match="compile_memory_budget='auto' reached the memory estimate unresolved"):
        estimate_memory(cfg, torch.device("cuda"))


def test_the_estimate_keeps_each_blocks_input_plus_the_budgets_share_of_the_rest():
    from align.plan.memory import estimate_memory

    cuda = torch.device("cuda")
    base = ["experiment=bench/gemma4_lora_noac", "sampler.max_tokens=16384"]
    acts = {b: estimate_memory(typed(*base, f"trainer.compile_memory_budget={b}"), cuda).activations
            for b in (0.0, 0.5, 1.0)}
    assert acts[1.0] == estimate_memory(typed(*base, "trainer.compile_memory_budget=null"), cuda).activations
    assert acts[0.0] < acts[0.5] < acts[1.0]
    assert acts[0.5] - acts[0.0] == pytest.approx((acts[1.0] - acts[0.0]) / 2, rel=1e-6)
    layers, hidden = 30, 2816  # Gemma-4 26B-A4B: at 0 every block keeps its bf16 input alone
    assert acts[0.0] == layers * hidden * 2 * 16384
    eager = typed(*base, "trainer.compile_memory_budget=0.5", "trainer.compile=auto", "attention=eager")  # auto: off
    assert estimate_memory(eager, cuda).activations == acts[1.0]  # eager blocks: no partitioner to budget
