"""trainer.cuda_alloc_conf: applied only when the environment sets none, and what is in force is
what the run reports (the manifest's model.cuda_alloc_conf)."""

from __future__ import annotations

from align.trainer import apply_cuda_alloc_conf

KEY = "PYTORCH_CUDA_ALLOC_CONF"


def test_the_config_value_applies_when_the_environment_sets_none(monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    assert apply_cuda_alloc_conf("expandable_segments:True") == "expandable_segments:True"
    import os

    assert os.environ[KEY] == "expandable_segments:True"


def test_the_users_environment_wins_and_is_what_is_reported(monkeypatch):
    monkeypatch.setenv(KEY, "max_split_size_mb:64")
    assert apply_cuda_alloc_conf("expandable_segments:True") == "max_split_size_mb:64"


def test_null_leaves_the_environment_alone(monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    assert apply_cuda_alloc_conf(None) is None


def test_the_manifest_reports_the_conf_in_force(tmp_path, monkeypatch):
    from tests.conftest import build_trainer

    monkeypatch.setenv(KEY, "garbage_collection_threshold:0.9")
    t = build_trainer(tmp_path, "trainer.max_steps=1", "trainer.cuda_alloc_conf=expandable_segments:True")
    assert t.model_info["cuda_alloc_conf"] == "garbage_collection_threshold:0.9"
