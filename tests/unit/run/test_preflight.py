"""Preflight: kwargs checked by NAME against installed signatures, the dirty-tree gate, the checklist CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from align.config import to_typed
from align.core.signatures import KwargsSite, accepted_names, check_kwargs
from align.errors import ConfigError
from align.run.checklist import CHECKLIST, Context, Status
from align.run.cli import compose
from align.run.kwargs_sites import KWARGS_SITES, check_site
from align.run.preflight_checks import check_git, collect, run_preflight
from align.tools.preflight import main


def typed(*overrides: str):
    return to_typed(compose(list(overrides)))


# ------------------------------------------------------------------------------ kwargs by name


class TrainingArgumentsV4:  # stand-ins for transformers' TrainingArguments before and after 5
    def __init__(self, output_dir, learning_rate=5e-5, warmup_ratio=0.0, warmup_steps=0):
        pass


class TrainingArgumentsV5:  # lost `warmup_ratio`, kept `warmup_steps` (docs/pitfalls.md#7)
    def __init__(self, output_dir, learning_rate=5e-5, warmup_steps=0):
        pass


def test_a_parameter_that_left_the_installed_signature_fails_by_name():
    kw = {"learning_rate": 1e-4, "warmup_ratio": 0.05}
    check_kwargs(TrainingArgumentsV4, kw, "optimizer")  # the old library accepts it
    with pytest.raises(ConfigError) as e:
        check_kwargs(TrainingArgumentsV5, kw, "optimizer")
    msg = str(e.value)
    assert msg.startswith("optimizer: ") and "['warmup_ratio']" in msg
    assert "it accepts: learning_rate, output_dir, warmup_steps" in msg


def from_pretrained_standin(path, *args, local_files_only=False, **kwargs):
    dtype = kwargs.pop("dtype", None)
    if "attn_implementation" in kwargs:
        kwargs.pop("attn_implementation")
    kwargs.get("device_map")
    return dtype


def test_varkw_callables_accept_only_the_names_their_source_reads():
    names = accepted_names(from_pretrained_standin)
    assert {"path", "local_files_only", "dtype", "attn_implementation", "device_map"} <= names
    check_kwargs(from_pretrained_standin, {"dtype": "bf16", "attn_implementation": "sdpa"}, "model")
    with pytest.raises(ConfigError, match=r"\['attn_implementaton'\]"):  # a typo is not silently swallowed by **kwargs
        check_kwargs(from_pretrained_standin, {"attn_implementaton": "sdpa"}, "model")


def test_installed_from_config_reads_the_backend_names_from_kwargs():
    from transformers import MistralForCausalLM

    names = accepted_names(MistralForCausalLM._from_config)
    assert {"attn_implementation", "experts_implementation", "dtype"} <= names


def _kwargs_checks(cfg):
    return [c for c in collect(cfg) if c.item == "kwargs"]


@pytest.mark.parametrize("overrides", [
    (), ("model=olmoe", "model.moe.experts=grouped_mm"), ("model=gemma4", "parallel.activation_checkpointing=true"),
    ("optimizer=adamw8bit", "logger=none"), ("trainer.compile=true", "trainer.compile_dynamic=true"),
])
def test_every_kwargs_site_on_main_passes_for_shipped_configs(overrides):
    checks = _kwargs_checks(typed("allow_dirty=true", *overrides))
    assert {c.name for c in checks} == set(KWARGS_SITES)
    bad = [f"{c.name}: {c.detail}" for c in checks if c.status not in (Status.passed, Status.na)]
    assert not bad, bad
    assert sum(c.status == Status.passed for c in checks) >= 5


def test_readding_a_removed_kwarg_fails_preflight(monkeypatch):
    import align.optim

    real = align.optim.scheduler_kwargs
    monkeypatch.setattr(align.optim, "scheduler_kwargs",
                        lambda cfg, n: {**real(cfg, n), "warmup_ratio": cfg.warmup_ratio})
    cfg = typed("allow_dirty=true", "logger=none")
    [sched] = [c for c in _kwargs_checks(cfg) if c.name == "lr scheduler"]
    assert sched.status == Status.failed and "['warmup_ratio']" in sched.detail and "num_warmup_steps" in sched.detail
    with pytest.raises(ConfigError, match=r"^optimizer: .*warmup_ratio"):
        run_preflight(cfg)


def test_a_misspelt_model_override_fails_although_the_config_class_swallows_it():
    from transformers import MistralConfig

    assert MistralConfig(sliding_windw=32).sliding_windw == 32  # the library accepts anything, silently
    [mc] = [c for c in _kwargs_checks(typed("allow_dirty=true", "+model.overrides.sliding_windw=32"))
            if c.name == "model config class"]
    assert mc.status == Status.failed and mc.key == "model.overrides" and "['sliding_windw']" in mc.detail


def test_a_compile_kwarg_torch_does_not_take_fails_preflight(monkeypatch):
    import align.parallel.compile as comp

    monkeypatch.setattr(comp, "compile_kwargs", lambda dynamic: {"dynamc": dynamic})
    [c] = [c for c in _kwargs_checks(typed("allow_dirty=true", "trainer.compile=true"))
           if c.name == "torch.compile of the blocks"]
    assert c.status == Status.failed and c.key == "trainer.compile_dynamic" and "['dynamc']" in c.detail


def test_a_new_call_site_registers_with_one_line(monkeypatch):
    monkeypatch.setitem(KWARGS_SITES, "stand-in", _standin_site)
    cfg = typed("allow_dirty=true", "logger=none")
    [c] = [c for c in _kwargs_checks(cfg) if c.name == "stand-in"]
    assert c.status == Status.failed and "['warmup_ratio']" in c.detail


def _standin_site(cfg):
    return KwargsSite(TrainingArgumentsV5, {"warmup_ratio": cfg.optimizer.warmup_ratio}, "optimizer")


def test_a_missing_callable_is_a_failure_not_a_pass():
    c = check_site("gone", KwargsSite("torch.optim:AdamWThatDoesNotExist", {}, "optimizer"))
    assert c.status == Status.failed and "AdamWThatDoesNotExist" in c.detail


# ---------------------------------------------------------------------------------- dirty tree


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    _git(r, "config", "user.email", "t@t")
    _git(r, "config", "user.name", "t")
    (r / "code.py").write_text("x = 1\n")
    _git(r, "add", "code.py")
    _git(r, "commit", "-qm", "init")
    return r


def _git_check(cfg, root):
    return list(check_git(cfg, Context(root=root, stop_on_fail=False)))[0]


def test_dirty_tree_gate(repo):
    cfg, allowed = typed(), typed("allow_dirty=true")
    assert _git_check(cfg, repo).status == Status.passed
    (repo / "untracked.py").write_text("y = 2\n")  # untracked files do not count
    assert _git_check(cfg, repo).status == Status.passed
    (repo / "code.py").write_text("x = 2\n")  # tracked change
    c = _git_check(cfg, repo)
    assert c.status == Status.failed and "refusing to start" in c.detail and "code.py" in c.detail
    assert _git_check(allowed, repo).status == Status.warned
    _git(repo, "add", "code.py")  # staged change
    assert _git_check(cfg, repo).status == Status.failed
    with pytest.raises(ConfigError, match=r"^git: refusing to start"):
        run_preflight(cfg, root=repo)


def test_cheap_failures_stop_before_any_kwargs_check(repo):
    (repo / "code.py").write_text("x = 3\n")
    report = collect(typed(), root=repo, stop_on_fail=True)
    assert report.failures and report.failures[0].item == "tree"
    assert not [c for c in report if c.item == "kwargs"]  # the library imports never happened


def test_outside_a_git_checkout_the_tree_item_warns_with_a_reason(tmp_path):
    c = _git_check(typed(), tmp_path)
    assert c.status == Status.warned and "not a git checkout" in c.detail


# ---------------------------------------------------------------------------------------- CLI


def test_preflight_cli_prints_the_whole_checklist(capsys):
    assert main(["allow_dirty=true", "logger=none"]) == 0
    out = capsys.readouterr().out
    for _, text, _ in CHECKLIST:
        assert text in out
    assert "preflight PASS" in out


def test_preflight_cli_fails_a_broken_config_with_exit_2(capsys, tmp_path):
    assert main(["allow_dirty=true", "logger=none", "data.source=jsonl", f"data.path={tmp_path}/missing.jsonl",
                 "+model.overrides.sliding_windw=8"]) == 2
    out = capsys.readouterr().out
    assert "[!] config validated" in out and "no such file" in out
    assert "[!] cache key covers the change" in out  # a file that cannot be hashed is not a pass
    assert "[!] kwargs checked by NAME" in out and "sliding_windw" in out
    assert "preflight FAIL" in out


def test_an_encode_cache_key_that_cannot_be_computed_is_a_fail_line(monkeypatch):
    import sys
    import types

    def parts(data_cfg, model_cfg):
        raise ConfigError("data.mask_files", "no such file: /gone/mask.json")

    monkeypatch.setitem(sys.modules, "align.data.encode_cache", types.SimpleNamespace(cache_key_parts=parts))
    from align.run.preflight_checks import check_cache

    [key] = [c for c in check_cache(typed(), Context(root=Path("."), stop_on_fail=False))
             if c.name == "encode cache key"]
    assert key.status == Status.failed and key.key == "data.mask_files" and "/gone/mask.json" in key.detail


# ------------------------------------------------------------------------- checkpoint files, cheaply


def _checkpoint(d: Path, shards: int = 1) -> Path:
    """A local HF-layout dir with real safetensors files (numpy tensors; no model needed)."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "mistral", "hidden_size": 8}))
    tensors = {f"w{i}": np.arange(64, dtype=np.float32).reshape(8, 8) + i for i in range(4)}
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"))
        return d
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(d / fname))
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_a_whole_checkpoint_passes_the_file_checks(tmp_path):
    from align.models.checkpoint_files import checkpoint_problem

    assert checkpoint_problem(_checkpoint(tmp_path / "one")) is None
    assert checkpoint_problem(_checkpoint(tmp_path / "three", shards=3)) is None


def test_a_corrupt_config_json_is_named_with_its_position(tmp_path):
    from align.models.checkpoint_files import checkpoint_problem

    d = _checkpoint(tmp_path / "c")
    (d / "config.json").write_text('{"model_type": "mistral",\n "hidden_size": 8,')
    why = checkpoint_problem(d)
    assert why is not None and str(d / "config.json") in why and "not valid JSON" in why and "line 2" in why, why
    (d / "config.json").write_text("[1, 2]")
    assert "not an object" in checkpoint_problem(d)


@pytest.mark.parametrize("cut", [-1, -100, 20, 4])
def test_a_truncated_safetensors_file_is_refused_from_its_header(tmp_path, cut):
    from align.models.checkpoint_files import checkpoint_problem

    d = _checkpoint(tmp_path / "t")
    _truncate(d / "model.safetensors", cut)
    why = checkpoint_problem(d)
    assert why is not None and str(d / "model.safetensors") in why and "truncated" in why, why


def test_a_safetensors_file_longer_than_its_header_says_is_refused(tmp_path):
    from align.models.checkpoint_files import checkpoint_problem

    d = _checkpoint(tmp_path / "l")
    with (d / "model.safetensors").open("ab") as f:
        f.write(b"\0" * 16)
    assert "longer than its header says" in checkpoint_problem(d)


def test_a_sharded_checkpoint_is_checked_shard_by_shard(tmp_path):
    import json

    from align.models.checkpoint_files import checkpoint_problem

    d = _checkpoint(tmp_path / "s", shards=2)
    _truncate(d / "model-00002-of-00002.safetensors", -8)
    assert "model-00002-of-00002.safetensors is truncated" in checkpoint_problem(d)
    d = _checkpoint(tmp_path / "m", shards=2)
    (d / "model-00001-of-00002.safetensors").unlink()
    assert "cannot read" in checkpoint_problem(d) and "model-00001-of-00002" in checkpoint_problem(d)
    d = _checkpoint(tmp_path / "n", shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["w_extra"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "lacks 1 tensor(s)" in checkpoint_problem(d) and "w_extra" in checkpoint_problem(d)


def test_a_dir_without_weights_is_refused(tmp_path):
    from align.models.checkpoint_files import checkpoint_problem

    d = _checkpoint(tmp_path / "w")
    (d / "model.safetensors").unlink()
    assert "no weights in" in checkpoint_problem(d)


def test_moe_options_on_a_dense_model_fail_preflight_by_key():
    for override, key in (("model.moe.experts=grouped_mm", "model.moe.experts"),
                          ("model.moe.telemetry=false", "model.moe.telemetry")):
        with pytest.raises(ConfigError, match=rf"^{key}: mistral builds a dense model"):
            run_preflight(typed("allow_dirty=true", "logger=none", override))


def test_compile_artifacts_that_torch_cannot_read_fail_preflight_by_key(tmp_path):
    """Refused before the run dir exists (the build's own load is the backstop); a file not there yet
    passes: the run writes it."""
    junk = tmp_path / "artifacts.bin"
    junk.write_bytes(b"junk")
    with pytest.raises(ConfigError, match="trainer.compile_artifacts.*not torch.compiler cache artifacts"):
        run_preflight(typed("logger=none", "allow_dirty=true", f"trainer.compile_artifacts={junk}"))
    with pytest.raises(ConfigError, match="trainer.compile_artifacts.*must name a file"):
        run_preflight(typed("logger=none", "allow_dirty=true", f"trainer.compile_artifacts={tmp_path}"))
    report = collect(typed("logger=none", "allow_dirty=true", f"trainer.compile_artifacts={tmp_path / 'new.bin'}"))
    (item,) = [c for c in report.checks if c.key == "trainer.compile_artifacts"]
    assert item.status == Status.passed and "written at the end of the run" in item.detail


# ------------------------------------------------------------------------------ data files and rows


def _rows(tmp_path: Path, *rows) -> Path:
    import json

    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


@pytest.mark.parametrize("overrides,ids,table", [
    ((), [4, 99999, 5], "size 4096, model.overrides.vocab_size"),
    # Gemma-4's per-layer embeddings have their own, smaller vocabulary: 700 is inside the main one only.
    (("model=gemma4", "+model.overrides.vocab_size=1024", "+model.overrides.vocab_size_per_layer_input=512"),
     [4, 700, 5], "size 512, model.embed_tokens_per_layer"),
])
def test_token_ids_outside_the_vocabulary_name_file_and_line_in_preflight(tmp_path, overrides, ids, table):
    """Held against the meta model's tables: no tokenizer, encode or weights, before the run dir."""
    f = _rows(tmp_path, {"input_ids": [1, 2, 3]}, {"input_ids": ids}, {"input_ids": [6, 7]})
    cfg = typed("allow_dirty=true", "logger=none", "data=tokens", f"data.path={f}", *overrides)
    with pytest.raises(ConfigError) as e:
        run_preflight(cfg)
    assert e.value.key == f"{f}:2" and f"token id {max(ids)} is out of the model's vocabulary ({table}" \
        in e.value.message, str(e.value)
    good = _rows(tmp_path, {"input_ids": [1, 2]})
    ok = collect(typed("allow_dirty=true", "logger=none", "data=tokens", f"data.path={good}", *overrides))
    assert [c.status for c in ok if c.name == "token ids"] == [Status.passed]


def test_a_bad_token_row_fails_preflight_before_any_library_check(tmp_path):
    f = _rows(tmp_path, {"input_ids": [1, 2, 3]}, {"input_ids": [True, 5, False]})
    report = collect(typed("allow_dirty=true", "logger=none", "data=tokens", f"data.path={f}"), stop_on_fail=True)
    [failed] = report.failures
    assert failed.key == f"{f}:2" and "'input_ids'[0] is true" in failed.detail
    assert not [c for c in report if c.item == "kwargs"]  # stopped among the cheap checks


def test_a_directory_as_data_path_is_named_a_directory(tmp_path):
    report = collect(typed("allow_dirty=true", "logger=none", "data=jsonl", f"data.path={tmp_path}"))
    details = {c.name: c.detail for c in report.failures}
    assert details["data file"].startswith(f"{tmp_path} is a directory; accepted: a JSONL file")
    assert details["data content hash"] == f"cannot hash the data: {details['data file']}"


def test_a_save_to_disk_directory_is_hashed_and_its_record_format_reported(tmp_path):
    import datasets

    d = tmp_path / "saved"
    datasets.Dataset.from_list([{"instruction": "Add 2 and 3.", "input": "", "output": "5"}]).save_to_disk(str(d))
    report = collect(typed("allow_dirty=true", "logger=none", "data=jsonl", f"data.path={d}"))
    checks = {c.name: c for c in report}
    assert [checks[n].status for n in ("data file", "data content hash", "record format")] == [Status.passed] * 3
    assert checks["record format"].detail == "saved: alpaca (detected, save_to_disk)"
    named = collect(typed("allow_dirty=true", "logger=none", "data=jsonl", f"data.path={d}", "data.format=alpaca"))
    assert {c.name: c.detail for c in named}["record format"] == "saved: alpaca (named by data.format)"
