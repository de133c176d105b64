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


def test_memory_metrics_read_peak_and_retries_from_one_allocator_snapshot(monkeypatch):
    import torch

    from align.trainer import memory_metrics

    calls = []

    def stats(device):
        calls.append(device)
        return {"allocated_bytes.all.peak": 3 * 2**30, "num_alloc_retries": 7}

    monkeypatch.setattr(torch.cuda, "memory_stats", stats)
    assert memory_metrics(torch.device("cuda", 0)) == {"mem_peak_gib": 3.0, "mem_alloc_retries": 7}
    assert len(calls) == 1  # one snapshot per step, not one per key
    assert memory_metrics(torch.device("cpu")) == {"mem_peak_gib": None, "mem_alloc_retries": None}
