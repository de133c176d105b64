"""The manifest: present-and-null from the first write, reasons for every null, final and read-only."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from align.core.hashing import tokenizer_hashes
from align.core.provenance import GitState, git_state
from align.probes.sdpa import classify_kernels
from align.run.manifest import (
    SCHEMA,
    SCHEMA_VERSION,
    Manifest,
    dynamo_counters,
    key_paths,
    load,
    manifest_paths,
    null_leaves,
    skeleton,
)
from align.run.record import exit_of


def test_skeleton_has_every_schema_key_and_a_reason_for_every_null():
    sk = skeleton()
    assert set(manifest_paths(sk)) == set(key_paths(SCHEMA))
    assert sk["schema_version"] == SCHEMA_VERSION
    assert all(p in sk["null_reasons"] for p in null_leaves(sk) if p not in ("status",))


def test_manifest_lifecycle(tmp_path):
    m = Manifest(tmp_path)
    m.start(name="r", argv=["a=1"], overrides=["a=1"], resolved={"a": 1}, git=GitState(reason="not a git checkout: x"),
            allow_dirty=False, redacted=[], env={}, preflight=[])
    first = load(tmp_path)
    assert first["status"] == "started" and set(manifest_paths(first)) == set(key_paths())
    assert first["git"]["commit"] is None and first["null_reasons"]["git.commit"] == "not a git checkout: x"
    assert first["run"]["exit_code"] is None and first["null_reasons"]["run.exit_code"].startswith("pending")
    m.set("seed", 3)
    with pytest.raises(KeyError):
        m.set("model.not_in_schema", 1)
    m.complete(0, "completed")
    final = load(tmp_path)
    assert final["status"] == "complete" and final["run"]["exit_code"] == 0 and final["seed"] == 3
    assert set(manifest_paths(final)) == set(key_paths())
    for p in null_leaves(final):
        assert p in final["null_reasons"], p
    assert not any(r.startswith("pending") for r in final["null_reasons"].values())
    assert final["null_reasons"]["versions.torch"].startswith("not reached")
    assert not os.stat(tmp_path / "provenance.json").st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    with pytest.raises(RuntimeError, match="read-only"):
        m.write("complete")


def test_git_state_outside_a_checkout_is_null_with_a_reason(tmp_path):
    g = git_state(tmp_path)
    assert g.commit is None and g.dirty is None and "not a git checkout" in g.reason


def test_git_state_records_dirty_and_a_diff_hash(tmp_path):
    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    git("init", "-q"), git("config", "user.email", "t@t"), git("config", "user.name", "t")
    (tmp_path / "f").write_text("1\n")
    git("add", "f"), git("commit", "-qm", "c")
    clean = git_state(tmp_path)
    assert clean.dirty is False and clean.diff_sha256 is None
    assert len(clean.commit) == 40 and not clean.describe.endswith("-dirty")
    (tmp_path / "f").write_text("2\n")
    a = git_state(tmp_path)
    (tmp_path / "f").write_text("3\n")
    b = git_state(tmp_path)
    assert a.dirty and a.describe.endswith("-dirty") and a.changed == ["f"]
    assert a.diff_sha256 and a.diff_sha256 != b.diff_sha256  # the hash follows the diff's content


def test_a_frame_past_the_recompile_limit_is_counted():
    """Past dynamo's recompile limit a frame runs eager from then on: compiled blocks whose caches had
    filled measured as eager ones (H200, 2026-11-30). The manifest says how often it happened."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    for n in range(3):
        double(torch.ones(n + 1))
    assert dynamo_counters()[0]["recompile_limit_hits"] == 0
    for n in range(3, 12):  # a graph per size: past the limit of 8
        double(torch.ones(n + 1))
    assert dynamo_counters()[0]["recompile_limit_hits"] >= 1


def test_a_forced_recompile_and_a_forced_graph_break_are_counted():
    """The manifest's dynamo counts are the one in-band evidence of what compiled code ran; read them
    through the same reader the manifest uses."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    double(torch.ones(2))
    first, _ = dynamo_counters()
    assert (first["recompiles"], first["graph_breaks"], first["unique_graphs"]) == (0, 0, 1)
    double(torch.ones(3))  # a new static shape fails the guards: the frame compiles again
    assert dynamo_counters()[0]["recompiles"] == 1

    def broken(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    torch.compile(broken, backend="eager")(torch.ones(2))
    got, why = dynamo_counters()
    assert why is None and got["graph_breaks"] == 1 and got["recompiles"] == 1
    assert list(got["graph_break_reasons"]) == ["Call to `torch._dynamo.graph_break()`"]


def test_dynamo_counters_never_raise(monkeypatch):
    import torch._dynamo.utils as du

    counters, why = dynamo_counters()
    assert (counters is None) != (why is None)

    class Broken(dict):
        def __getitem__(self, k):
            raise RuntimeError("moved")

        def get(self, *a):
            raise RuntimeError("moved")

    monkeypatch.setattr(du, "counters", Broken())
    counters, why = dynamo_counters()
    assert counters is None and "moved" in why


def test_tokenizer_hashes_follow_content_not_path(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    a = tokenizer_hashes(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages }} ")
    b = tokenizer_hashes(tmp_path)
    assert a[0] != b[0] and a[1] != b[1]


def test_kernel_family_from_symbols():
    assert classify_kernels(["fmha_cutlassF_bf16_aligned_64x128_rf_sm80"]) == "efficient"
    assert classify_kernels(["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>"]) == "flash"
    assert classify_kernels(["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"]) == "cudnn"
    assert classify_kernels(["ampere_sgemm_128x64_nn"]) is None


@pytest.mark.parametrize("exc,code", [(SystemExit(143), 143), (KeyboardInterrupt(), 130), (ValueError("x\ny"), 1)])
def test_exit_of(exc, code):
    got, reason = exit_of(exc)
    assert got == code and "\n" not in reason


def test_manifest_json_is_valid_and_keys_are_ordered_like_the_schema(tmp_path):
    m = Manifest(tmp_path)
    m.write("started")
    data = json.loads((tmp_path / "provenance.json").read_text())
    assert list(data) == list(SCHEMA)
