"""SFT behind the objective seam equals a plain hand-written SFT step, bit for bit: the same window,
forward, summed CE / window loss tokens, backward, clip and AdamW step. A seam that changes the
normalisation, the head bypass or the order of operations moves a parameter and fails here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from align.config import to_typed
from align.data.collate import IGNORE
from align.objectives.ce import ChunkedCE
from align.parallel.grad import clip_grad_norm_

SMALL = ["data.max_records=32", "sampler=shuffle", "sampler.micro_batch_size=2", "trainer.grad_accum=2", "logger=none",
         "trainer.max_steps=2", "allow_dirty=true"]


def _ce(model, b, chunk):
    if chunk:  # the decoder's last hidden states, then the head + CE in chunks
        hidden = model.model(**b.model_inputs()).last_hidden_state
        return ChunkedCE(model.get_output_embeddings(), chunk, None)(hidden, b.labels)
    logits = model(**b.model_inputs()).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), b.labels.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def _plain_step(model, optimizer, scheduler, window, max_norm, chunk):
    loss_tokens = sum(b.loss_tokens for b in window)
    total = torch.zeros(())
    for b in window:
        ce = _ce(model, b, chunk)
        loss = ce / loss_tokens
        loss.backward()
        total += loss.detach()
    clip_grad_norm_(model.parameters(), max_norm, optimizer)  # align's own clip: not what the seam moves
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(total)


@pytest.mark.parametrize("chunk", [0, 7])
def test_sft_through_the_seam_equals_a_hand_written_step(compose, tmp_path, chunk):
    from align.optim import build_optimizer, build_scheduler
    from align.probes.common import build_trainer

    cfg = to_typed(compose([*SMALL, f"trainer.loss_chunk_tokens={chunk}", "optimizer.max_grad_norm=0.5"]))
    trainer = build_trainer(cfg, tmp_path)
    assert trainer.objective.describe()["loss"] == trainer.model_info["loss"]
    model = copy.deepcopy(trainer.model)
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), torch.device("cpu"))
    scheduler = build_scheduler(cfg.optimizer, optimizer, cfg.trainer.max_steps)
    batches = iter(trainer.stream)
    for _ in range(2):
        window = [next(batches) for _ in range(cfg.trainer.grad_accum)]
        want = _plain_step(model, optimizer, scheduler, window, cfg.optimizer.max_grad_norm, chunk)
        metrics, _ = trainer.train_step(iter(window))
        assert metrics["loss"] == want
    for (name, a), b in zip(trainer.model.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    trainer.history.close()
