"""trainer.compile compiles each decoder block, trains, and the manifest says so with dynamo's
counters; a pre-tokenized id out of the vocabulary is refused before step 1."""

from __future__ import annotations

import json

import numpy as np
import pytest

from align.errors import ConfigError
from tests.conftest import build_trainer, recorded_run


@pytest.mark.slow
def test_compiled_blocks_train_and_are_recorded(tmp_path):
    t = build_trainer(tmp_path, "trainer.compile=true", "trainer.max_steps=2", "trainer.export=false",
                      "data.max_records=16", "sampler.pad_to_multiple_of=64")
    assert t.model_info["compile"] == {"blocks": 2, "block_class": "MistralDecoderLayer",
                                       "granularity": "decoder block", "checkpoint_side_effects": "forward only",
                                       "dynamic": True}
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in t.model.model.layers)
    assert t.fit() == 0
    import torch._dynamo.utils as du

    assert du.counters["stats"]["unique_graphs"] >= 1


@pytest.mark.parametrize("dynamic, graphs", [(True, 1), (None, 2)])
def test_dynamic_blocks_compile_once_for_every_ragged_shape(dynamic, graphs):
    """Ragged batches change (rows, width) every step: with dynamic=None a block compiles for the
    first shape and again, dynamic, at the second; with dynamic=True once."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from transformers import MistralConfig, MistralForCausalLM

    from align.parallel.compile import compile_blocks

    torch._dynamo.reset()
    counters.clear()
    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2))
    info = compile_blocks(model, dynamic, backend="eager")
    assert info["dynamic"] is dynamic
    for rows, width in [(2, 24), (3, 40), (4, 56), (5, 16)]:  # one row would be another graph: 0/1 specialization
        model(input_ids=torch.randint(0, 64, (rows, width)), use_cache=False).logits.sum().backward()
    assert counters["stats"]["unique_graphs"] == graphs


def test_compile_blocks_applies_the_checkpoint_side_effect_rule_it_records():
    """compile_blocks turns on dynamo's process-wide skip_fwd_side_effects_in_bwd_under_checkpoint
    (off by default, and off a write inside a checkpointed compiled block sends the block to eager)
    and records the value it reads back."""
    import torch._dynamo.config
    from transformers import MistralConfig, MistralForCausalLM

    from align.parallel.compile import compile_blocks

    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2))
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=False):  # a fresh process's value
        info = compile_blocks(model, True, backend="eager")
        assert torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint is True
    assert info["checkpoint_side_effects"] == "forward only"


def _olmoe_run(tmp_path, monkeypatch, layers: int, compiled: bool, *extra: str, model: str = "olmoe"):
    import functools

    import numpy as np
    import torch._dynamo
    from torch._dynamo.utils import counters

    import align.parallel.compile as comp
    import align.trainer

    monkeypatch.setattr(align.trainer, "compile_blocks", functools.partial(comp.compile_blocks, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    t = build_trainer(tmp_path / f"{model}{layers}{compiled}{len(extra)}", f"model={model}", "model.preset=tiny",
                      f"trainer.compile={compiled}", "trainer.compile_dynamic=true",
                      f"+model.overrides.num_hidden_layers={layers}", "trainer.max_steps=4", "trainer.export=false",
                      "sampler=budget", "sampler.max_tokens=384", "sampler.pad_to_multiple_of=8",
                      "sampler.mask_padding=false", "model.moe.lb_weight=0.01", *extra)
    assert t.fit() == 0
    from align.telemetry.history import read_history

    losses = [r["loss"] for r in read_history(t.history.path) if "loss" in r]
    return int(counters["stats"]["unique_graphs"]), np.stack(t.runtime.moe.loads), dict(counters["graph_break"]), losses


def test_router_telemetry_inside_compiled_blocks_adds_no_graph_per_layer_and_counts_the_same(tmp_path, monkeypatch):
    """The router hooks are eager islands in a compiled block: traced, their Python state (the layer
    number, how much the forward had stashed) went into the guards and a block recompiled per layer
    until dynamo's limit sent it back to eager."""
    graphs_2, *_ = _olmoe_run(tmp_path, monkeypatch, 2, True)
    graphs_4, loads, *_ = _olmoe_run(tmp_path, monkeypatch, 4, True)
    _, eager, *_ = _olmoe_run(tmp_path, monkeypatch, 4, False)
    assert graphs_4 == graphs_2
    assert loads.shape[1] == 4 and np.array_equal(loads, eager)


@pytest.mark.parametrize("model, extra", [("olmoe", ()), ("gemma4_moe", ("model.lora.enabled=true",))])
def test_activation_checkpointed_blocks_compile_with_their_router_hooks(tmp_path, monkeypatch, model, extra):
    """Under activation checkpointing a compiled block is one checkpoint region: a graph break inside
    it (the router hooks as eager islands) or a write to Python state (the hooks' tensors, Gemma-4's
    stored keys and values) sent the whole block to eager, so compiling gained nothing. Now every
    block compiles, nothing breaks, and the losses and router loads are the eager run's."""
    import torch._dynamo.config

    ac = ("parallel.activation_checkpointing=true", *extra)
    # off as in a fresh process (an earlier test's compile_blocks may have turned it on), so that
    # only the trainer's own call can turn it on
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=False):
        graphs, loads, breaks, losses = _olmoe_run(tmp_path, monkeypatch, 4, True, *ac, model=model)
    _, eager_loads, _, eager_losses = _olmoe_run(tmp_path, monkeypatch, 4, False, *ac, model=model)
    assert graphs >= 1 and breaks == {}
    assert np.array_equal(loads, eager_loads) and losses == eager_losses


def test_a_compiled_runs_manifest_counts_its_recompiles_and_graph_breaks(tmp_path, monkeypatch):
    """End to end through RunRecord: a torch.compiler.disable'd hook on every block's MLP (an eager
    island, a graph break in every block) and compile_dynamic=null, which compiles a block again at
    the second shape."""

    import torch._dynamo
    from torch._dynamo.utils import counters

    import align.parallel.compile as comp
    import align.trainer
    from align.run.manifest import load

    def compile_with_islands(model, dynamic, backend="eager"):
        island = torch.compiler.disable(lambda module, args, output: None)
        for block in model.model.layers:
            block.mlp.register_forward_hook(island)
        return comp.compile_blocks(model, dynamic, backend=backend)

    monkeypatch.setattr(align.trainer, "compile_blocks", compile_with_islands)
    torch._dynamo.reset()
    counters.clear()
    t, run_dir = recorded_run(tmp_path, ["model=olmoe", "data.max_records=16", "trainer.compile=true",
                                         "trainer.compile_dynamic=null", "trainer.max_steps=3"])
    dyn = load(run_dir)["dynamo"]
    assert dyn["recompiles"] >= 1 and dyn["unique_graphs"] > dyn["recompiles"]
    assert dyn["graph_breaks"] >= t.model.config.num_hidden_layers
    assert any("disable" in reason for reason in dyn["graph_break_reasons"])
    assert dyn["recompile_limit_hits"] == 0
    import torch._dynamo.config

    assert load(run_dir)["compile"]["recompile_limit"] == torch._dynamo.config.recompile_limit  # read back


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 99999]}) + "\n")
    with pytest.raises(ConfigError, match="out of the model's vocabulary"):
        build_trainer(tmp_path, "data=tokens", f"data.path={rows}", f"data.cache_dir={tmp_path / 'c'}")


def test_token_ids_outside_a_per_layer_embedding_vocabulary_are_refused(tmp_path):
    """Gemma-4's per-layer embeddings (PLE) have their own vocabulary: an id inside the main one but
    outside the PLE's hit the embedding as an IndexError at step 1; now it is a one-line refusal."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 700]}) + "\n")
    with pytest.raises(ConfigError, match="embed_tokens_per_layer"):
        build_trainer(tmp_path, "model=gemma4", "data=tokens", f"data.path={rows}", f"data.cache_dir={tmp_path / 'c'}",
                      "+model.overrides.vocab_size=1024", "+model.overrides.vocab_size_per_layer_input=512")


def test_a_frozen_reference_compiles_like_the_policy(tmp_path, monkeypatch):
    """DPO's frozen copy runs the same blocks as the policy on the same rows: left eager under
    trainer.compile it was a second, uncompiled forward of every step."""
    import functools

    import torch._dynamo

    import align.parallel.compile as comp
    import align.trainer

    monkeypatch.setattr(align.trainer, "compile_blocks", functools.partial(comp.compile_blocks, backend="eager"))
    torch._dynamo.reset()
    t = build_trainer(tmp_path, "objective=dpo", "data=gsm8k_pairs", "objective.reference=model",
                      "trainer.compile=true", "trainer.max_steps=2", "trainer.export=false", "data.max_records=16")
    frozen = t.objective.reference.module
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in frozen.model.layers)
    assert t.fit() == 0


def test_a_cpu_runs_manifest_says_what_compile_auto_resolved_to_and_what_the_first_step_cost(tmp_path):
    """The default (auto) resolves off on a CPU, and the manifest says so and why; time to the first step
    and the compile share are in the throughput summary, present whatever compiled."""
    import torch._dynamo

    from align.run.manifest import load

    torch._dynamo.reset()  # dynamo's per-frame counts are per process: earlier tests' frames do not count
    t, run_dir = recorded_run(tmp_path, ["data.max_records=16", "trainer.max_steps=2"])
    m = load(run_dir)
    from tests.integration.test_truthful_run import assert_present_and_null

    assert_present_and_null(m)
    assert m["config"]["resolved"]["trainer"]["compile"] == "auto"
    assert m["compile"]["trainer"]["requested"] == "auto" and m["compile"]["trainer"]["resolved"] is False
    assert "device cpu" in m["compile"]["trainer"]["why"] and "device cpu" in m["compile"]["optimizer"]["why"]
    assert m["compile"]["inductor_cache"] is None and "compile.inductor_cache" in m["null_reasons"]
    assert m["null_reasons"]["compile.artifacts"] == "nothing compiles in this run"
    assert m["compile"]["frames_over_expected"] == []
    assert m["compile"]["recompile_limit"] is None and "compile.recompile_limit" in m["null_reasons"]
    # the default sampler's budget: what auto resolved to on this CPU, and the identity a resume checks
    assert m["config"]["resolved"]["sampler"]["max_tokens"] == "auto"
    assert m["sampler_budget"]["requested"] == "auto" and m["sampler_budget"]["resolved"] == 4096
    assert "on cpu" in m["sampler_budget"]["why"] and t.identity["sampler"]["max_tokens"] == 4096
    assert m["config"]["resolved"]["trainer"]["loss_chunk_tokens"] == "auto"  # and the loss's chunk: all logits
    assert m["loss_chunk"] == {"requested": "auto", "resolved": 0, "why": m["loss_chunk"]["why"]}
    assert "on cpu" in m["loss_chunk"]["why"] and t.objective.chunk_tokens == 0
    assert m["memory_budget"]["requested"] == "auto" and m["memory_budget"]["resolved"] is None  # torch's default
    assert "on cpu" in m["memory_budget"]["why"]
    assert m["compile"]["memory_budget"] is None and "compile.memory_budget" in m["null_reasons"]  # nothing compiled
    assert t.model_info["compile"] is None and t.model_info["optimizer_step"]["kind"] == "plain"
    assert m["throughput"]["throughput/first_step_s"] > 0
    assert 0 <= m["throughput"]["throughput/compile_share"] <= 1


@pytest.mark.parametrize("model, expected", [("mistral", 2), ("gemma4", 6)])
def test_the_manifest_expects_a_compile_per_block_variant(tmp_path, model, expected):
    """Gemma-4's blocks meet three guard sets (docs/performance.md#fast-by-default): the bound the
    end-of-run warning reads counts them, from the built model's config."""
    t = build_trainer(tmp_path, f"model={model}", "trainer.compile=true", "trainer.max_steps=1",
                      "trainer.export=false", "data.max_records=8")
    assert t.model_info["compile_choice"]["expected_compiles_per_frame"] == expected


def test_compile_artifacts_are_loaded_before_the_first_compile_and_saved_at_the_end(tmp_path, monkeypatch):
    """The wiring (the mechanism is tests/unit/parallel/test_compile_artifacts.py): the first run finds
    no file and writes what torch hands it at the end; the next run loads that file before its model
    compiles; the manifest records both, and is present-and-null without the key."""
    import torch.compiler
    from torch.compiler._cache import CacheInfo

    import align.trainer
    from align.parallel.compile import compile_blocks
    from align.run.manifest import load

    monkeypatch.setattr(align.trainer, "compile_blocks", lambda m, d: compile_blocks(m, d, backend="eager"))
    info = CacheInfo()
    info.artifacts["inductor"] = ["k1", "k2"]
    loaded: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", info))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data) or info)
    path = tmp_path / "cache" / "artifacts.bin"
    ov = ["data.max_records=8", "trainer.max_steps=1", "trainer.compile=true", f"trainer.compile_artifacts={path}"]
    _, run_dir = recorded_run(tmp_path / "a", ov)
    first = load(run_dir)["compile"]["artifacts"]
    assert first["loaded"] is None and first["saved"] == {"bytes": 9, "artifacts": {"inductor": 2}}
    assert path.read_bytes() == b"artifacts" and loaded == []
    _, run_dir = recorded_run(tmp_path / "b", ov)
    assert loaded == [b"artifacts"]
    assert load(run_dir)["compile"]["artifacts"]["loaded"] == {"bytes": 9, "artifacts": {"inductor": 2}}
    _, run_dir = recorded_run(tmp_path / "c", ["data.max_records=8", "trainer.max_steps=1", "trainer.compile=true"])
    m = load(run_dir)
    assert m["compile"]["artifacts"] is None
    assert m["null_reasons"]["compile.artifacts"] == "trainer.compile_artifacts is null"
