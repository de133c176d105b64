"""Preflight checks the activation-checkpointing call parallelize() actually makes: same method, same
kwargs (they drifted once: preflight checked gradient_checkpointing_enable while the trainer called
activation_checkpointing_enable)."""

from __future__ import annotations

from align.config import to_typed
from align.parallel.wrap import enable_activation_checkpointing
from align.run.cli import compose
from align.run.kwargs_sites import activation_checkpointing


def test_the_checked_call_is_the_call_made():
    from transformers import MistralConfig, MistralForCausalLM

    model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
    calls = []
    for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
        if hasattr(model, name):
            setattr(model, name, lambda _n=name, **kw: calls.append((_n, kw)))
    method = enable_activation_checkpointing(model)
    site = activation_checkpointing(to_typed(compose(["parallel.activation_checkpointing=true"])))
    assert calls == [(method, site.kwargs)]
    assert site.target.__name__ == method
