"""SFT loss: prompt tokens get no gradient, and the loss is a per-loss-token mean over the whole
accumulation window (not a mean of micro-batch means)."""

from __future__ import annotations

import numpy as np
import torch

from align.data.collate import IGNORE, collate
from align.data.encode import EncodedDataset
from align.objectives.ce import ce_sum


def _dataset(rows):
    toks = [np.array(t, dtype=np.int32) for t, _ in rows]
    masks = [np.array(m, dtype=bool) for _, m in rows]
    lens = np.array([len(t) for t in toks])
    return EncodedDataset(np.concatenate(toks), np.concatenate(masks), np.concatenate([[0], np.cumsum(lens)]),
                          [str(i) for i in range(len(rows))], ["r"] * len(rows))


def test_labels_are_shifted_and_masked_tokens_are_ignored():
    data = _dataset([([1, 5, 6, 7, 8, 2], [0, 0, 0, 1, 1, 1])])
    b = collate(data, np.array([0]), pad_id=0)
    # position p predicts token p+1, only where token p+1 is a loss token
    assert b.labels.tolist() == [[IGNORE, IGNORE, 7, 8, 2, IGNORE]]
    assert b.attention_mask is None and b.loss_tokens == 3


def test_masked_tokens_get_no_gradient():
    data = _dataset([([1, 5, 6, 7, 8, 2], [0, 0, 0, 1, 1, 1]), ([1, 9, 3, 2], [0, 0, 1, 1])])
    b = collate(data, np.array([0, 1]), pad_id=0)
    logits = torch.randn(*b.input_ids.shape, 16, requires_grad=True)
    ce_sum(logits, b.labels).backward()
    g = logits.grad.abs().sum(-1)
    # from the encoded loss masks, not from the labels under test: position p trains token p+1
    target = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.all(g[~target] == 0), "a prompt or padding position received gradient"
    assert torch.all(g[target] > 0)


def _grads(model, batches, denom):
    model.zero_grad()
    for b in batches:
        (ce_sum(model(**b.model_inputs()).logits, b.labels) / denom).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_window_loss_is_a_per_token_mean_however_the_window_is_cut():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, sliding_window=None))
    rows = [([1, 4, 5, 6, 7, 8, 9, 2], [0, 0, 1, 1, 1, 1, 1, 1]), ([1, 4, 3, 2], [0, 0, 0, 1])]
    data = _dataset(rows)
    whole = collate(data, np.array([0, 1]), pad_id=0)
    parts = [collate(data, np.array([0]), pad_id=0), collate(data, np.array([1]), pad_id=0)]
    n = whole.loss_tokens
    g_whole = _grads(model, [whole], n)
    g_parts = _grads(model, parts, n)
    for a, b in zip(g_whole, g_parts):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # A mean of micro-batch means weighs the short row's single token 6x: the gradients differ.
    model.zero_grad()
    for b in parts:
        (ce_sum(model(**b.model_inputs()).logits, b.labels) / b.loss_tokens / len(parts)).backward()
    g_mean_of_means = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert any(not torch.allclose(a, b, rtol=1e-3) for a, b in zip(g_whole, g_mean_of_means))
