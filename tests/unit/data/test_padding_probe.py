"""`probe=padding`: the bucket sweep table from the data alone, as JSON, a table and a PNG."""

from __future__ import annotations

import json

from align.config import to_typed
from align.probes import padding


def test_padding_probe_sweeps_buckets_and_writes_json_and_png(compose, tmp_path, capsys):
    cfg = to_typed(compose(["probe=padding", "data.max_records=400", f"data.cache_dir={tmp_path / 'cache'}",
                            "sampler=shuffle", "sampler.micro_batch_size=4",
                            "probe.padding.window=2"], config_name="probe"))
    assert padding.run(cfg, tmp_path / "out") == 0
    result = json.loads((tmp_path / "out" / "padding.json").read_text())
    rows = result["rows"]
    assert [r["bucket_size"] for r in rows] == [None, 2, 8, 32, 128, 512, "all"] and rows[0]["sampler"] == "shuffle"
    assert rows[-1]["pad_waste"] < rows[3]["pad_waste"] < rows[0]["pad_waste"]
    assert rows[-1]["zero_pad_frac"] > rows[0]["zero_pad_frac"]
    assert all(r["max_batch_tokens"] > 0 and r["roots_per_window"] >= 1 for r in rows)
    assert result["header"]["records"] == 400 and result["header"]["window"] == 2 and result["header"]["roots"] >= 5
    assert (tmp_path / "out" / "padding.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "padding waste" in out and "roots/window" in out and len(out.strip().splitlines()) == 9
