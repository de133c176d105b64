"""`python -m align.report DIR`: one row per job of a multirun dir, from overrides and history."""

from __future__ import annotations

import json

from align import report


def _job(root, n, overrides, rows):
    d = root / str(n)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(step, loss, tokens, real, t, zero, roots):
    return {"step": step, "loss": loss, "tokens": tokens, "real_tokens": real, "step_time_s": t,
            "pad_waste": 1 - real / tokens, "zero_pad_frac": zero, "roots_in_window": roots}


def test_report_reads_every_job(tmp_path, capsys):
    _job(tmp_path, 0, ["sampler=bucket", "sampler.bucket_size=2"], [_row(1, 5.0, 100, 50, 9.0, 0, 3), _row(2, 4.0, 100, 60, 1.0, 0.5, 2)])
    _job(tmp_path, 1, ["sampler=bucket", "sampler.bucket_size=32"], [_row(1, 5.0, 100, 90, 1.0, 1, 4), _row(2, 3.5, 100, 100, 0.5, 1, 4)])
    (tmp_path / "10").mkdir()  # a job that died before writing anything: still a row
    (tmp_path / "10" / ".hydra").mkdir()
    assert report.main([str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "report.json").read_text())
    assert [r["job"] for r in rows] == ["0", "1", "10"]
    a, b, dead = rows
    assert a["real_tokens_per_s"] == 60.0  # step 1 is left out of the rate
    assert a["pad_waste"] == 1 - 110 / 200 and a["zero_pad_frac"] == 0.25 and a["roots_per_window"] == 2.5
    assert a["final_loss"] == 4.0 and b["final_loss"] == 3.5 and b["pad_waste"] == 1 - 190 / 200
    assert dead["status"] == "no history"
    out = capsys.readouterr().out
    assert "shared overrides: sampler=bucket" in out and "sampler.bucket_size=32" in out
    assert (tmp_path / "report.png").stat().st_size > 5_000


def test_report_on_a_dir_without_jobs_exits_2(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "no job dirs" in capsys.readouterr().err
