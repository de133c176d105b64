"""Data through the real entry points: bad input exits 2 through `python -m align.train` with one
line naming file:line and nothing in the cache; the bucket sweep runs and `align.tools.report` reads it;
a run's history rows and summary carry the data stats."""

from __future__ import annotations

import json

import pytest

from align.config import to_typed
from align.tools import report
from tests.conftest import run_cli


def test_malformed_jsonl_exits_2_naming_file_and_line_and_caches_nothing(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "c", "response": "d"}\n{"prompt": oops}\n')
    cache = tmp_path / "cache"
    p = run_cli("align.train", "data=jsonl", f"data.path={data}", f"data.cache_dir={cache}", "logger=none",
                "allow_dirty=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("align: error:")]
    assert errors == [f"align: error: {data}:3: malformed JSON (Expecting value) "
                      "(set data.on_bad_record=skip to skip such records)"]
    assert not cache.exists()
    assert not (tmp_path / "run" / "history.jsonl").exists()


def test_history_rows_and_summary_carry_the_data_stats(compose, tmp_path):
    from align.trainer import Trainer

    cfg = to_typed(compose(["trainer.max_steps=3", "trainer.grad_accum=2", "trainer.export=false", "logger=none",
                            "data.max_records=64", f"data.cache_dir={tmp_path / 'cache'}", "sampler=bucket",
                            "sampler.bucket_size=16"]))
    trainer = Trainer.build(cfg, tmp_path / "run")
    assert trainer.fit() == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert 0 <= r["pad_waste"] < 1 and 0 <= r["zero_pad_frac"] <= 1 and r["roots_in_window"] >= 1
        assert r["pad_waste"] == pytest.approx(1 - r["real_tokens"] / r["tokens"])
    s = trainer.summary()
    for key in ("pad_waste", "zero_pad_frac", "roots_per_window", "shuffle_roots_per_window", "plan_pad_waste",
                "plan_zero_pad_frac", "plan_roots_per_window", "E_w", "E_w2", "w2_ratio", "truncated",
                "dropped_too_long", "skipped_bad", "encode_cache_hit", "encode_cache_key"):
        assert key in s, key
    assert s["pad_waste"] == pytest.approx(1 - s["real_tokens"] / s["tokens"])
    assert s["roots_per_window"] == pytest.approx(sum(r["roots_in_window"] for r in rows) / 3)
    assert s["encode_cache_key"] == trainer.data.meta["encode_cache_key"] and s["plan_window"] == 2


@pytest.mark.slow
def test_bucket_sweep_runs_and_report_prints_one_row_per_job(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    p = run_cli("align.train", "-m", "sampler=bucket", "sampler.bucket_size=2,32,512", "data.max_seq_len=512,1024",
                "trainer.max_steps=2", "logger=none", "trainer.export=false", "data.max_records=96", "allow_dirty=true",
                f"data.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert report.main([str(sweep)]) == 0
    rows = json.loads((sweep / "report.json").read_text())
    assert len(rows) == 6 and all(r["status"] == "ok" and r["steps"] == 2 for r in rows)
    varying = [" ".join(o for o in r["overrides"] if o.startswith(("sampler.bucket_size", "data.max_seq_len")))
               for r in rows]
    assert varying == [f"sampler.bucket_size={b} data.max_seq_len={m}" for b in (2, 32, 512) for m in (512, 1024)]
    # Tighter buckets pad less (same seed, same records): bucket 512 covers all 96 records = a full sort.
    waste = {int(r["overrides"][1].split("=")[1]): r["pad_waste"] for r in rows}
    assert waste[512] < waste[2]
    assert (sweep / "report.png").is_file() and len(capsys.readouterr().out.splitlines()) >= 8
