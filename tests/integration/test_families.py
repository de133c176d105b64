"""Each family's tiny preset trains, and its HF export loads in transformers with the same fp32 logits."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import HF_KINDS, build_trainer, recorded_run, tiny_hf_checkpoint

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


@pytest.mark.parametrize("kind", HF_KINDS)
def test_model_hf_trains_a_checkpoint_of_no_family_and_exports_the_same_architecture(tmp_path, kind):
    """`model=hf` on a tiny Llama / Qwen2 / Qwen3 / Phi-3 checkpoint: trained through its own class, the
    family and class in the manifest, exported as that model_type (Qwen2's q/k/v biases kept), and
    AutoModelForCausalLM loads the export with the trained model's logits."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from align.run.manifest import load

    d = tiny_hf_checkpoint(kind, tmp_path / "ckpt")
    trainer, run_dir = recorded_run(tmp_path, ["model=hf", f"model.pretrained={d}", "trainer.max_steps=2",
                                               "data.max_records=16"], export=True)
    m = load(run_dir)["model"]
    cls = type(trainer.model).__name__
    assert m["family"] == "hf" and m["class"] == cls == json.loads((d / "config.json").read_text())["architectures"][0]
    assert m["extra"]["model_type"] == kind and m["extra"]["family_requested"] == "hf"
    assert m["weights"]["missing"] == m["weights"]["unexpected"] == 0 and m["attn_implementation_resolved"] == "sdpa"
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 2

    export = run_dir / "export"
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == kind and config["architectures"] == [cls]
    tensors = load_file(export / "model.safetensors")
    trained = dict(trainer.model.named_parameters())
    assert set(tensors) == set(trained)
    biases = [n for n in tensors if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))]
    assert bool(biases) == (kind == "qwen2")  # Qwen2's attention biases, trained away from their zero init
    for n in biases:
        assert torch.equal(tensors[n], trained[n].detach()) and tensors[n].abs().sum() > 0, n

    loaded = AutoModelForCausalLM.from_pretrained(export, local_files_only=True, dtype=torch.float32)
    assert type(loaded) is type(trainer.model)
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
