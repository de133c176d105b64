"""`shard_order`: the ranks' shares cover every prompt once, each rank gets the same count (lockstep
decoding needs the same number of backend calls on every rank), and one rank gets them all in order."""

from __future__ import annotations

import contextlib

import pytest

from align.evaluation.runner import shard_order


@pytest.mark.parametrize("n,world", [(5, 2), (1, 4), (7, 3), (8, 2), (3, 1)])
def test_shares_cover_every_prompt_once_with_equal_counts(n, world):
    prompts = [[0] * (i % 4 + 1) for i in range(n)]
    shares = [shard_order(prompts, r, world) for r in range(world)]
    assert len({len(order) for order, _ in shares}) == 1
    own = sorted(i for order, real in shares for i in order[:real])
    assert own == list(range(n))


def test_one_rank_generates_longest_first_with_no_padding():
    prompts = [[0], [0, 0, 0], [0, 0]]
    assert shard_order(prompts, 0, 1) == ([1, 2, 0], 3)


def test_a_sharded_compiled_model_generates_uncompiled_with_compilation_suspended():
    """Under fsdp/ep there is no copy to generate with: the shared model generates with a static,
    uncompiled cache and dynamo's stance at force_eager, so the compiled blocks see no eval shapes."""
    from types import SimpleNamespace

    from transformers import MistralConfig, MistralForCausalLM

    from align.evaluation.schedule import TrainingEval
    from align.generation import GenerateMode

    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2))
    ev = TrainingEval.__new__(TrainingEval)
    from align.generation import EngineConfig

    ev.engine_cfg, ev.copy = EngineConfig(lockstep=True), None
    ev.tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    ev.env = SimpleNamespace(distributed=True)
    engine, stance = ev._engine(model, compiled=True)
    assert engine.model is model and engine.mode is GenerateMode.static and ev.copy is None
    import torch

    assert not torch.compiler.is_compiling()
    probe = torch.compile(lambda x: x + 1, backend="eager")
    from torch._dynamo.utils import counters

    counters.clear()
    with stance():
        probe(torch.ones(2))
    assert counters["stats"]["unique_graphs"] == 0  # suspended: the compiled function ran eager
    probe(torch.ones(2))
    assert counters["stats"]["unique_graphs"] == 1  # and the stance is back once the eval is over
    ev.env = SimpleNamespace(distributed=False)
    engine, stance = ev._engine(model, compiled=True)
    assert engine is ev.copy and engine.model is not model and stance is contextlib.nullcontext
    engine, _ = ev._engine(model, compiled=False)
    assert engine.model is model


def test_an_eval_copy_that_missed_its_sync_is_refused():
    """The eval's copy of a compiled model is fingerprint-checked against the training weights before
    every eval: a sync that did not take would score a stale model under the current step's name."""
    from types import SimpleNamespace

    import pytest
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    from align.errors import AlignError
    from align.evaluation.schedule import TrainingEval
    from align.generation import EngineConfig

    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2))
    ev = TrainingEval.__new__(TrainingEval)
    ev.engine_cfg, ev.copy = EngineConfig(), None
    ev.tokenizer, ev.env = SimpleNamespace(pad_token_id=0, eos_token_id=1), SimpleNamespace(distributed=False)
    ev._engine(model, compiled=True)  # the copy is made
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)  # a training step
    ev._engine(model, compiled=True)  # synced: accepted
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    ev.copy.sync_from = lambda m: None  # the sync does not take
    with pytest.raises(AlignError, match="does not hold the training weights"):
        ev._engine(model, compiled=True)
