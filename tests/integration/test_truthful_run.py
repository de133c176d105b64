"""A run's provenance.json says what it resolved to, has every key whatever the run used, never
carries a secret, and a dirty tree stops `align.train` before anything is written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from align.config import to_typed
from align.core.redaction import REDACTED
from align.errors import EXIT_CONFIG, ConfigError
from align.run.cli import compose
from align.run.manifest import key_paths, load, manifest_paths, null_leaves
from align.run.record import RunRecord
from tests.conftest import REPO, run_cli

SECRETS = {"ALIGN_PLANTED_API_KEY": "sk-planted-0xdeadbeef-1", "HF_TOKEN": "hf_planted_0xdeadbeef_2",
           "MY_DB_PASSWORD": "pw-planted-0xdeadbeef-3"}
# Credential-shaped values under names that say nothing: the run's name and two logger strings, which reach
# the manifest, .hydra/, the plot's title, W&B's run record (name, project, tags) and its summary.
SHAPED = {"name": "hf_aB3dE5gH7jK9mN1pQ3sT5vX7zA9cD1eF3g", "logger.project": "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
          "logger.tags": "ghp_" + "a1" * 18}


def assert_present_and_null(manifest: dict) -> None:
    """Every schema key present, nothing else, and every null explained (none left pending)."""
    assert set(manifest_paths(manifest)) == set(key_paths())
    for p in null_leaves(manifest):
        assert p in manifest["null_reasons"], f"{p} is null without a reason"
    assert not [p for p, r in manifest["null_reasons"].items() if r.startswith("pending")]


def files_containing(root: Path, needles: list[str]) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            hits += [f"{p}: {n[:6]}..." for n in needles if n.encode() in data]
    return hits


@pytest.mark.slow
def test_train_writes_a_complete_manifest_and_leaks_no_planted_secret(tmp_path):
    run_dir = tmp_path / "run"
    shaped = [f"{k}={v}" if k != "logger.tags" else f"{k}=[{v}]" for k, v in SHAPED.items()]
    p = run_cli("align.train", f"hydra.run.dir={run_dir}", "allow_dirty=true", "trainer.max_steps=2",
                "data.max_records=32", "trainer.export=false", *shaped, env={**SECRETS, "WANDB_MODE": "offline"})
    assert p.returncode == 0, p.stderr[-3000:]
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["status"] == "complete" and m["run"]["exit_code"] == 0 and m["run"]["exit_reason"] == "completed"
    assert not os.access(run_dir / "provenance.json", os.W_OK) or os.geteuid() == 0
    assert m["model"]["attn_implementation_requested"] == "auto"  # attention=auto, the default; resolved below
    assert m["model"]["attn_implementation_resolved"] == "sdpa"
    assert m["git"]["commit"] and m["git"]["describe"] and m["git"]["dirty"] in (True, False)
    assert (m["git"]["diff_sha256"] is not None) == m["git"]["dirty"]
    assert m["versions"]["torch"] and m["versions"]["transformers"] and m["config"]["hash"]
    assert m["data"]["sha256"] and m["data"]["tokenizer_sha256"] and m["data"]["chat_template_sha256"]
    assert m["throughput"]["steps"] == 2 and m["mask_probe"]["ok"] is True
    assert any("pad" in k for k in m["sampler"]["stats"])  # padding waste of epoch 0, whoever computes it
    assert m["preflight"] and {c["item"] for c in m["preflight"]} >= {"tree", "kwargs", "config"}
    # planted secrets: names recorded as redacted, values nowhere (manifest, history, .hydra, W&B, console)
    assert m["env"]["ALIGN_PLANTED_API_KEY"] == REDACTED and m["env"]["HF_TOKEN"] == REDACTED
    assert "MY_DB_PASSWORD" not in m["env"]
    assert {"env:ALIGN_PLANTED_API_KEY", "env:HF_TOKEN"} <= set(m["redacted"])
    assert not files_containing(run_dir, list(SECRETS.values()))
    assert not [v for v in SECRETS.values() if v in p.stdout + p.stderr]
    # W&B got the provenance summary
    assert files_containing(run_dir / "wandb", ["provenance/model/attn_implementation_resolved"])
    # credential-shaped values: every file the run wrote (W&B's offline files too) and the console, none of them
    assert (run_dir / "plots" / "loss.png").is_file() and list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not files_containing(run_dir, [v[:12] for v in SHAPED.values()])  # not even cut short
    assert not [v for v in SHAPED.values() if v in p.stdout + p.stderr]
    assert m["run"]["name"] == REDACTED
    assert {"run.name", "name", "logger.project", "logger.tags[0]"} <= set(m["redacted"])
    from tests.wandb_log import read_run

    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    w = read_run(wandb_dir)
    assert (w["run"]["name"], w["run"]["project"], w["config"]["logger"]["tags"]) == (REDACTED, REDACTED, [REDACTED])
    assert w["summary"]["provenance/run/name"] == REDACTED


def _copy_repo(dst: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("align", "conf"):
        shutil.copytree(REPO / part, dst / part, ignore=ignore)
    for cmd in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"], ["add", "-A"],
                ["commit", "-qm", "snapshot"]):
        subprocess.run(["git", "-C", str(dst), *cmd], check=True, capture_output=True)
    return dst


def test_train_refuses_a_dirty_tree_before_creating_anything(tmp_path):
    repo = _copy_repo(tmp_path / "repo")
    with (repo / "align" / "objectives" / "ce.py").open("a") as f:
        f.write("\n# an uncommitted change\n")
    run_dir = tmp_path / "run"
    # small settings so that a broken gate fails this test in seconds rather than training the default run
    p = run_cli("align.train", f"hydra.run.dir={run_dir}", "trainer.max_steps=1", "data.max_records=16", "logger=none",
                "trainer.export=false", cwd=repo, env={"PYTHONPATH": str(repo)})
    assert p.returncode == EXIT_CONFIG, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("align: error: git: refusing to start") and "align/objectives/ce.py" in lines[-1]
    assert not run_dir.exists()


# ----------------------------------------------------------------- in-process: what was RESOLVED


def _record(tmp_path: Path, *overrides: str, container_extra: dict | None = None):
    from align.run.preflight_checks import collect

    cfg = compose(["data.max_records=24", "trainer.max_steps=1", "allow_dirty=true", *overrides])
    typed = to_typed(cfg)
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=True)
    for path, value in (container_extra or {}).items():
        node = container
        *head, last = path.split(".")
        for h in head:
            node = node[h]
        node[last] = value
    run_dir = tmp_path / "run"
    record = RunRecord(typed, container, run_dir, ["allow_dirty=true", *overrides], list(overrides))
    return typed, record, run_dir, collect(typed)


def _build(typed, record, run_dir):
    from align.trainer import Trainer

    return Trainer.build(typed, run_dir, record.wandb_config, None)


def test_moe_run_records_the_resolved_experts_kernel_not_the_request(tmp_path):
    typed, record, run_dir, checks = _record(tmp_path, "model=olmoe", "logger=none")
    with record:
        record.start(checks)
        trainer = _build(typed, record, run_dir)
        record.built(trainer)
        record.finished(trainer, 0)
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["model"]["experts_implementation_requested"] is None
    assert m["model"]["experts_implementation_resolved"] == trainer.model.config._experts_implementation == "grouped_mm"
    assert "not requested" in m["null_reasons"]["model.experts_implementation_requested"]
    assert m["model"]["weights"] is None and m["null_reasons"]["model.weights"].startswith("random init")
    # the kwargs preflight checks are the ones the call site uses (no drift between check and call)
    from align.run.kwargs_sites import data_loader

    assert data_loader(typed).kwargs.keys() == trainer.stream.kwargs.keys()


def test_a_checkpoint_run_records_what_the_load_put_into_the_model(tmp_path):
    from tests.conftest import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "ckpt", overrides={"tie_word_embeddings": True})
    typed, record, run_dir, checks = _record(tmp_path, f"model.pretrained={ckpt}", "logger=none")
    with record:
        record.start(checks)
        trainer = _build(typed, record, run_dir)
        record.built(trainer)
        record.finished(trainer, 0)
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["model"]["weights"] == {
        "loaded": 20, "missing": 0, "unexpected": 0, "mismatched": 0,  # 21 tensors, the head tied to the embedding
        "allowed_missing": {"tied": {"lm_head.weight": "model.embed_tokens.weight"},
                            "non_persistent_buffers": ["model.rotary_emb.inv_freq",
                                                       "model.rotary_emb.original_inv_freq"]}}
    assert "weights" not in m["model"]["extra"]


def test_a_backend_the_library_changed_is_recorded_as_resolved(tmp_path):
    typed, record, run_dir, checks = _record(tmp_path, "model=gemma4", "logger=none")
    with record:
        record.start(checks)
        trainer = _build(typed, record, run_dir)
        trainer.model.set_attn_implementation("eager")  # what a library-side downgrade looks like
        record.built(trainer)
        record.finished(trainer, 0)
    m = load(run_dir)
    assert m["model"]["attn_implementation_requested"] == "auto"
    assert m["model"]["attn_implementation_resolved"] == "eager"
    assert m["mask_probe"]["ok"] and m["mask_probe"]["attn_implementation"] == "eager"
    assert m["null_reasons"]["model.sdpa_kernel_family"].startswith("attention resolved to eager")


def test_a_planted_config_secret_reaches_neither_manifest_nor_hydra_dir_nor_wandb(tmp_path, monkeypatch):
    secret = "sk-config-planted-0xfeedface"
    hydra_dir = tmp_path / "run" / ".hydra"
    hydra_dir.mkdir(parents=True)
    (hydra_dir / "config.yaml").write_text(f"logger:\n  api_key: {secret}\n  project: align\n")
    (hydra_dir / "overrides.yaml").write_text(f"- +logger.api_key={secret}\n- model=mistral\n")
    (hydra_dir / "hydra.yaml").write_text(f"hydra:\n  overrides:\n    task:\n    - +logger.api_key={secret}\n  job:\n"
                                          f"    override_dirname: +logger.api_key={secret},model=mistral\n")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr("sys.argv", ["align.train", f"+logger.api_key={secret}"])
    typed, record, run_dir, checks = _record(tmp_path, "logger=wandb", container_extra={"logger.api_key": secret})
    with record:
        record.start(checks)
        trainer = _build(typed, record, run_dir)
        record.built(trainer)
        trainer.logger.finish(0)
        record.finished(trainer, 0)
    m = load(run_dir)
    assert m["config"]["resolved"]["logger"]["api_key"] == REDACTED and "logger.api_key" in m["redacted"]
    assert "model=mistral" in (hydra_dir / "overrides.yaml").read_text()  # the rest survives the scrub
    assert not files_containing(run_dir, [secret])


def test_mask_gate_failure_before_step_1_ends_the_run_with_exit_2_on_record(tmp_path, monkeypatch):
    import transformers.models.gemma4.modeling_gemma4 as g4

    monkeypatch.setattr(g4, "create_sliding_window_causal_mask", lambda **kw: None)
    # sdpa: a skipped mask is full causal attention there (attention=layered applies the window itself
    # when a sliding layer gets no mask, and its gate passes on the kernel's own band)
    typed, record, run_dir, checks = _record(tmp_path, "model=gemma4", "attention=sdpa", "logger=none")
    with pytest.raises(ConfigError):
        with record:
            record.start(checks)
            record.built(_build(typed, record, run_dir))
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["run"]["exit_code"] == EXIT_CONFIG and "mask probe" in m["run"]["exit_reason"]
    assert m["mask_probe"]["ok"] is False and m["status"] == "complete"
    assert m["throughput"]["steps"] == 0  # built, never stepped


def test_a_crash_before_build_still_completes_the_manifest(tmp_path):
    typed, record, run_dir, checks = _record(tmp_path, "logger=none")
    with pytest.raises(RuntimeError):
        with record:
            record.start(checks)
            raise RuntimeError("disk on fire")
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["run"]["exit_code"] == 1 and m["run"]["exit_reason"] == "RuntimeError: disk on fire"
    assert m["null_reasons"]["model.attn_implementation_resolved"].startswith("not reached")
    assert m["null_reasons"]["throughput"] == "the trainer was never built"
    assert json.loads((run_dir / "provenance.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("code,reason", [(143, "coordinated stop on a signal"), (81, "non-finite halt")])
def test_the_trainers_exit_code_and_its_meaning_are_recorded(tmp_path, code, reason):
    typed, record, run_dir, checks = _record(tmp_path, "logger=none")
    with record:
        record.start(checks)
        record.finished(None, code)
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["run"]["exit_code"] == code and m["run"]["exit_reason"].startswith(reason)


@pytest.mark.parametrize("override", [None, "data.cache_dir", "data.cache=false"])
def test_the_encode_cache_directory_and_its_source_are_recorded_beside_the_key(tmp_path, override):
    extra = {None: [], "data.cache_dir": [f"data.cache_dir={tmp_path / 'c'}"], "data.cache=false": ["data.cache=false"]}
    typed, record, run_dir, checks = _record(tmp_path, "logger=none", *extra[override])
    with record:
        record.start(checks)
        record.finished(None, 0)
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["data"]["encode_cache_key"]
    want = {None: {"dir": str(Path(os.environ["ALIGN_CACHE_DIR"]) / "encode"), "source": "$ALIGN_CACHE_DIR/encode"},
            "data.cache_dir": {"dir": str(tmp_path / "c"), "source": "data.cache_dir"}, "data.cache=false": None}
    assert m["data"]["encode_cache_dir"] == want[override]
    if override == "data.cache=false":
        assert m["null_reasons"]["data.encode_cache_dir"].startswith("data.cache=false")


def test_encode_cache_provenance_is_taken_from_the_data_pipeline(tmp_path, monkeypatch):
    # Stand-in for align.data.encode_cache (data branch): preflight and start() compute the key from files;
    # after build, the encoded dataset's own .meta (cache hit or miss) is what gets recorded.
    import sys
    import types

    from align.run.preflight_checks import collect

    monkeypatch.setitem(sys.modules, "align.data.encode_cache",
                        types.SimpleNamespace(cache_key_parts=lambda d, m: {"key": "a" * 64}))
    typed, record, run_dir, _ = _record(tmp_path, "logger=none")
    [c] = [c for c in collect(typed) if c.name == "encode cache key"]
    assert c.status.value == "PASS" and c.detail.startswith("a" * 16)
    with record:
        record.start(collect(typed))
        assert load(run_dir)["data"]["encode_cache_key"] == "a" * 64
        trainer = _build(typed, record, run_dir)
        trainer.data.meta = {"encode_cache_key": "b" * 64, "cache_hit": True, "tokenizer_sha256": "c" * 64,
                             "sources": [{"path": "/d/x.jsonl", "sha256": "d" * 64}],
                             "aux_files": [{"path": "/d/mask.json", "sha256": "e" * 64}],
                             "formats": {"x": {"format": "alpaca", "chosen_by": "detected", "file": "jsonl"}}}
        record.built(trainer)
        record.finished(trainer, 0)
    m = load(run_dir)
    assert_present_and_null(m)
    assert m["data"]["encode_cache_key"] == "b" * 64 and m["data"]["encode_meta"]["cache_hit"] is True
    assert m["data"]["tokenizer_sha256"] == "c" * 64
    assert m["data"]["aux_files"]["/d/mask.json"] == "e" * 64 and m["data"]["aux_files"]["/d/x.jsonl"] == "d" * 64
    assert m["data"]["format"] == {"x": {"format": "alpaca", "chosen_by": "detected", "file": "jsonl"}}
