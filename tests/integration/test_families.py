"""Each family's tiny preset trains, and its HF export loads in transformers with the same fp32 logits."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_trainer

FAMILIES = ["mistral", "olmoe", "gemma4"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_family_trains_and_round_trips_through_from_pretrained(tmp_path, family):
    from transformers import AutoModelForCausalLM

    trainer = build_trainer(tmp_path, f"model={family}", "trainer.max_steps=4", "sampler=bucket")
    assert trainer.fit() == 0
    rows = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    assert len(rows) == 4
    assert trainer.model_info["family"] == family

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export", local_files_only=True,
                                                  dtype=torch.float32)
    assert type(loaded).__name__ == type(trainer.model).__name__
    loaded.eval()
    trainer.model.eval()
    batch = next(iter(trainer.stream))
    with torch.no_grad():
        a = trainer.model(**batch.model_inputs()).logits
        b = loaded(**batch.model_inputs()).logits
    assert (a - b).abs().max().item() < 1e-5


def test_pretrained_dir_brings_its_own_tokenizer_and_chat_template(tmp_path):
    first = build_trainer(tmp_path / "a", "trainer.max_steps=1")
    first.tokenizer.chat_template = first.tokenizer.chat_template.replace("<|end|>", "<|end|>\n")
    assert first.fit() == 0
    export = tmp_path / "a" / "run" / "export"
    second = build_trainer(tmp_path / "b", f"model.pretrained={export}", "trainer.max_steps=1")
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    assert second.model_info["pretrained"] == str(export) and second.model_info["preset"] is None
    # the checkpoint's template rendered the records: the extra newline token follows <|end|>
    end_id = second.tokenizer.convert_tokens_to_ids("<|end|>")
    row, _ = second.data.row(0)
    pos = list(row).index(end_id)
    assert second.tokenizer.decode(row[pos + 1 : pos + 2]) == "\n"


def test_trainer_weighs_every_loss_token_the_same_across_the_accumulation_window(tmp_path):
    """The gradient of one step with accum=2 x 1 row equals that of accum=1 x 2 rows (same rows).

    Gradients are compared at the optimizer step: Adam's first update is nearly sign(g), which would
    hide a wrong normalisation and amplify rounding in near-zero gradients."""
    seen = {}

    def capture(trainer, key):
        step = trainer.optimizer.step

        def wrapped(*args, **kwargs):
            seen[key] = [p.grad.clone() for p in trainer.model.parameters()]
            return step(*args, **kwargs)

        trainer.optimizer.step = wrapped

    a = build_trainer(tmp_path / "a",
                      "sampler=shuffle", "sampler.micro_batch_size=1", "trainer.grad_accum=2", "trainer.max_steps=1",
                      "trainer.export=false", "optimizer.max_grad_norm=0")
    b = build_trainer(tmp_path / "b", "sampler=shuffle", "sampler.micro_batch_size=2", "trainer.grad_accum=1",
                      "trainer.max_steps=1",
                      "trainer.export=false", "optimizer.max_grad_norm=0")
    capture(a, "a")
    capture(b, "b")
    assert a.fit() == b.fit() == 0
    for ga, gb in zip(seen["a"], seen["b"]):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-7)
