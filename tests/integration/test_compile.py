"""trainer.compile compiles each decoder block, trains, and the manifest says so with dynamo's
counters; a pre-tokenized id out of the vocabulary is refused before step 1."""

from __future__ import annotations

import json

import pytest

from align.errors import ConfigError
from tests.conftest import build_trainer


@pytest.mark.slow
def test_compiled_blocks_train_and_are_recorded(tmp_path):
    t = build_trainer(tmp_path, "trainer.compile=true", "trainer.max_steps=2", "trainer.export=false",
                      "data.max_records=16", "sampler.pad_to_multiple_of=64")
    assert t.model_info["compile"] == {"blocks": 2, "block_class": "MistralDecoderLayer", "granularity": "decoder block"}
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in t.model.model.layers)
    assert t.fit() == 0
    import torch._dynamo.utils as du

    assert du.counters["stats"]["unique_graphs"] >= 1


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
