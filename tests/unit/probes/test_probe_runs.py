"""Both probes run end to end on the tiny CPU config, driving the trainer's own build, collate and loss.
Times on this machine are not performance figures: these tests check mechanics and outputs only."""

from __future__ import annotations

import json
import re

import pytest

from align.config import to_typed

SMALL = ["data.max_records=32", "sampler=shuffle", "sampler.micro_batch_size=2", "allow_dirty=true"]


def test_scaling_probe_writes_table_json_and_png(compose, tmp_path, capsys):
    from align.probes import scaling

    cfg = to_typed(compose(["probe=scaling", "probe.scaling.lengths=[16,32,64]", "probe.scaling.warmup=0",
                            "probe.scaling.repeats=1", "probe.scaling.measure_steps=1", *SMALL], config_name="probe"))
    assert scaling.run(cfg, tmp_path) == 0
    out = capsys.readouterr().out
    for f in ("scaling.json", "scaling.md", "scaling.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    r = json.loads((tmp_path / "scaling.json").read_text())
    assert [p["w"] for p in r["points"]] == [16, 32, 64]
    assert all(p["rows"] == 2 and p["best_s"] > 0 and 0 < p["ce_forward_fraction"] < 1 for p in r["points"])
    a = r["analysis"]
    assert a["regime"] in ("linear", "quadratic", "launch-bound") and a["lever"]
    assert set(a["two_term"]["quadratic_share"]) == {"16", "32", "64"}
    # the prediction uses the data's own moments, and is compared with real trainer steps
    pr, me = r["prediction"], r["measured"]
    assert pr["records"]["E_w2"] >= pr["records"]["E_w"] ** 2
    assert pr["sampled_batches"]["n"] == 16  # 32 records / 2 rows
    assert me["steps"] == 1 and len(me["segments"]) == 1 and me["step_s_mean"] > 0
    assert me["ce_caveat"].startswith("CE forward only") and 0 < me["ce_forward_fraction_of_step"] < 1
    # a CPU has no ceiling MFU can be measured against: say so, print no percentage (it printed 198.85%)
    assert me["throughput"]["mfu_measured"] is None and me["throughput"]["mfu_datasheet"] is None
    assert "no trustworthy matmul ceiling" in me["throughput"]["mfu_measured_reason"]
    assert "no MFU against the measured ceiling: cpu: no trustworthy" in out and "MFU 1" not in out
    assert not re.search(r"MFU[^\n]*\d%", out)
    assert r["model"]["attn_implementation_resolved"] == "sdpa"
    assert "regime at the data's micro-batch widths" in out and "CE forward" in out


def test_probe_leaves_the_trainer_uninstrumented(compose, tmp_path):
    from align.probes.common import Instrument, build_trainer, fixed_width_batch

    cfg = to_typed(compose(["probe=scaling", *SMALL], config_name="probe"))
    trainer = build_trainer(cfg, tmp_path)
    loss_fn, fb = trainer.objective.loss_fn, trainer.forward_backward
    batch = fixed_width_batch(trainer.data, 2, 24, trainer.tokenizer.pad_token_id)
    assert batch.input_ids.shape == (2, 24) and batch.attention_mask is None  # no padding, no mask
    with Instrument(trainer) as inst:
        trainer.forward_backward(batch, batch.loss_tokens)
        got = inst.take()
    assert got["segments"] == [[(2, 24)]] and len(got["fwd_bwd_s"]) == 1 and len(got["ce_forward_s"]) == 1
    assert got["ce_forward_s"][0] < got["fwd_bwd_s"][0]
    assert trainer.objective.loss_fn is loss_fn and trainer.forward_backward == fb
    assert "forward_backward" not in vars(trainer)
    trainer.history.close()


def test_kernels_probe_on_cpu_says_there_are_no_device_kernels(compose, tmp_path, capsys):
    from align.probes import kernels

    cfg = to_typed(compose(["probe=kernels", "probe.kernels.warmup=0", "probe.kernels.timed_steps=1",
                            "probe.kernels.steps=1", *SMALL], config_name="probe"))
    assert kernels.run(cfg, tmp_path) == 0
    out = capsys.readouterr().out
    assert "NO DEVICE KERNELS: this run is on cpu" in out
    r = json.loads((tmp_path / "kernels.json").read_text())
    assert r["kernel_table"]["kernels"] == [] and r["time_split"] is None
    assert r["throughput_unprofiled"]["tokens_per_s"] > 0
    assert r["throughput_unprofiled"]["mfu_measured"] is None and "no MFU against the measured ceiling: cpu" in out
    assert "aten::mm" in (tmp_path / "profile_table.txt").read_text()  # the host ops were profiled
    assert any(row["name"] == "aten::mm" for row in json.loads((tmp_path / "profile_rows.json").read_text()))


@pytest.mark.parametrize("name", ["scaling", "kernels"])
def test_probes_are_registered(name):
    from align.tools.probe import PROBES

    assert PROBES[name] == f"align.probes.{name}"
