"""Chunked cross-entropy (trainer.loss_chunk_tokens) is the same loss and gradient as full logits,
with a Gemma soft-cap applied once, the LM head restored after each forward, and never more than a
chunk of logits alive at once."""

from __future__ import annotations

import pytest
import torch

from align.objectives.ce import ChunkedCE, bypass_lm_head, ce_sum
from tests.conftest import build_trainer


def _grads_at_step(trainer):
    seen = {}
    step = trainer.optimizer.step

    def wrapped(*a, **k):
        seen["g"] = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
        return step(*a, **k)

    trainer.optimizer.step = wrapped
    return seen


@pytest.mark.parametrize("family,extra", [("mistral", []), ("olmoe", []),
                                          ("gemma4", ["+model.overrides.final_logit_softcapping=5.0"])])
def test_chunked_loss_equals_full_logits_through_the_trainer(tmp_path, family, extra):
    common = [f"model={family}", "trainer.max_steps=1", "trainer.export=false", "optimizer.max_grad_norm=0",
              "data.max_records=32", *extra]
    full = build_trainer(tmp_path / "a", *common)
    chunked = build_trainer(tmp_path / "b", *common, "trainer.loss_chunk_tokens=16")
    ga, gb = _grads_at_step(full), _grads_at_step(chunked)
    assert full.fit() == chunked.fit() == 0
    rows = [(tmp_path / d / "run" / "history.jsonl").read_text() for d in ("a", "b")]
    import json

    la, lb = (json.loads(r.splitlines()[0])["loss"] for r in rows)
    assert la == pytest.approx(lb, rel=1e-5)
    for x, y in zip(ga["g"], gb["g"]):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    assert chunked.model_info["loss"]["kind"] == "chunked_ce" and full.model_info["loss"]["kind"] == "ce"
    assert type(chunked.model.get_output_embeddings()).__name__ == "Linear"  # restored after the forward
    if family == "gemma4":
        assert chunked.model.config.final_logit_softcapping == 5.0


def test_no_more_than_a_chunk_of_logits_is_kept_for_backward():
    from transformers import MistralConfig, MistralForCausalLM

    vocab, chunk = 500, 8
    model = MistralForCausalLM(MistralConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    x = torch.randint(0, vocab, (4, 32))
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        with bypass_lm_head(model):
            h = model(input_ids=x).logits
        loss = ChunkedCE(model.get_output_embeddings(), chunk, None)(h, x)
    loss.backward()
    vocab_sized = [s for s in shapes if vocab in s]
    assert vocab_sized, "the head's weight is saved at least"
    assert all(s[0] <= chunk or s == (vocab, 16) for s in vocab_sized), vocab_sized
    # and the full path does keep [tokens, vocab] logits: the check above can see the difference
    shapes.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        ce_sum(model(input_ids=x).logits, x)
    assert any(vocab in s and max(s[:-1] or (0,)) * (s[0] if len(s) > 2 else 1) > chunk for s in shapes)


def test_bypass_restores_the_head_when_the_forward_raises():
    from transformers import MistralConfig, MistralForCausalLM

    model = MistralForCausalLM(MistralConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
    head = model.get_output_embeddings()
    with pytest.raises(RuntimeError):
        with bypass_lm_head(model):
            raise RuntimeError("boom")
    assert model.get_output_embeddings() is head


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("train_head", [True, False])
def test_gradients_taken_in_the_forward_equal_autograds(softcap, train_head):
    """The chunked loss takes its gradients while each chunk's logits exist; they equal autograd's
    through full logits, for the hidden states and (when it trains) the head, soft-cap and ignored
    positions included. A frozen head (LoRA) gets no weight gradient and keeps none."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 13, 16, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(16, 40, bias=False).double()
    head.weight.requires_grad_(train_head)
    labels = torch.randint(0, 40, (2, 13), generator=g)
    labels[0, :3] = -100

    def full(h):
        logits = head(h)
        if softcap is not None:
            logits = torch.tanh(logits.float() / softcap) * softcap  # in fp32, as the trainer applies it
        return ce_sum(logits, labels)

    h_ref = hidden.clone().requires_grad_()
    want = full(h_ref)
    (2.5 * want).backward()
    w_ref = head.weight.grad.clone() if train_head else None
    head.weight.grad = None
    h = hidden.clone().requires_grad_()
    got = ChunkedCE(head, 5, softcap)(h, labels)
    (2.5 * got).backward()
    close = dict(rtol=1e-4, atol=1e-6)  # the softmax is fp32 in both, taken by different kernels
    torch.testing.assert_close(got, want, **close)
    torch.testing.assert_close(h.grad, h_ref.grad, **close)
    if train_head:
        torch.testing.assert_close(head.weight.grad, w_ref, **close)
    else:
        assert head.weight.grad is None
    with torch.no_grad():  # an eval forward: the loss alone
        torch.testing.assert_close(ChunkedCE(head, 5, softcap)(hidden, labels), want.detach())
