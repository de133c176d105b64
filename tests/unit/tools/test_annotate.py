"""Corrections go beside the manifest, never into it, and say what remains accurate (docs/triage.md#8)."""

from __future__ import annotations

import hashlib

import pytest

from align.run.manifest import GitState, Manifest, key_paths
from align.tools.annotate import NOTE, annotate, main


@pytest.fixture
def run_dir(tmp_path):
    m = Manifest(tmp_path)
    m.start(name="r", argv=[], overrides=[], resolved={"a": 1},
            git=GitState(root="/r", commit="35a4e8e" + "0" * 33, describe="35a4e8e", branch="main", dirty=False,
                         changed=[]),
            allow_dirty=False, redacted=[], env={}, preflight=[])
    m.set("model.attn_implementation_resolved", "flex_attention")
    m.complete(0, "completed")
    return tmp_path


def test_annotate_never_edits_the_manifest_and_lists_what_remains_accurate(run_dir):
    before = (run_dir / "provenance.json").read_bytes()
    note = annotate(run_dir, "The tree carried 224 uncommitted lines: git.commit does not describe the code that ran.")
    assert (run_dir / "provenance.json").read_bytes() == before
    text = note.read_text()
    assert hashlib.sha256(before).hexdigest() in text
    affected, accurate = text.split("### Affected by this correction")[1].split("### Remains accurate")
    assert "`git.commit`" in affected and "`model.attn_implementation_resolved`" not in affected
    assert '`model.attn_implementation_resolved`: "flex_attention"' in accurate and "`git.commit`" not in accurate
    listed = {ln.split("`")[1] for ln in (affected + accurate).splitlines() if ln.startswith("- `")}
    assert listed == set(key_paths()) - {"null_reasons"}  # every field is accounted for, one way or the other


def test_affects_flag_takes_keys_and_groups_and_notes_append(run_dir):
    annotate(run_dir, "first")
    note = annotate(run_dir, "versions were read from a different venv", affects=["versions", "device.name"])
    text = note.read_text()
    assert text.count("## Correction") == 2
    last = text.rsplit("## Correction", 1)[1]
    affected = last.split("### Affected by this correction")[1].split("### Remains accurate")[0]
    assert "`versions.torch`" in affected and "`device.name`" in affected and "`device.type`" not in affected


def test_unknown_key_is_refused_with_exit_2(run_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(run_dir), "x", "--affects", "git.comit"])
    assert e.value.code == 2
    assert "git.comit" in capsys.readouterr().err
    assert not (run_dir / NOTE).exists()


def test_a_run_dir_without_manifest_is_refused(tmp_path):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "x"])
    assert e.value.code == 2


@pytest.mark.parametrize("cut", ["half", "not a manifest"])
def test_a_truncated_or_foreign_manifest_is_refused_in_one_line(run_dir, capsys, cut):
    path = run_dir / "provenance.json"
    raw = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(raw[: len(raw) // 2] if cut == "half" else b'["a", "list"]\n')  # a kill during a copy
    with pytest.raises(SystemExit) as e:
        main([str(run_dir), "x"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"align: error: {path}: not a ")
    assert ("not a whole JSON document" in err[0]) == (cut == "half")
    assert not (run_dir / NOTE).exists()
