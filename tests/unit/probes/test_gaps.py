"""align.probes.gaps on hand-made traces: the union over streams, the phase charged, the totals."""

from __future__ import annotations

from align.probes.gaps import NO_HOST_OP, NO_PHASE, format_gaps, gap_report, host_at, idle_gaps


def k(ts, dur, name="k", stream=7):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def phase(ts, dur, name):
    return {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


TRACE = [
    k(0, 100, "gemm"), k(100, 50, "adam", stream=20),  # the side stream covers 100..150: no gap there
    k(150, 10, "add"),
    k(400, 100, "gemm2"),  # 160..400: a 240 us gap while the host logs
    {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 520, "dur": 30},  # 500..520: a 20 us gap in data
    k(900, 10, "first"),  # 550..900: 350 us, host in align.data nested inside align.step
    k(905, 1, "tiny"),  # 910..905: overlapping, no gap; 5 us gaps are below min_us
    phase(0, 1000, "align.step"), phase(150, 260, "align.log"), phase(500, 400, "align.data"),
    {"cat": "cpu_op", "name": "aten::item", "ts": 160, "dur": 300},  # not a phase: never charged
]


def test_gaps_are_idle_time_of_every_stream_charged_to_the_innermost_phase():
    gaps = idle_gaps(TRACE, min_us=15)
    assert [(g.start_us, g.end_us, g.phase) for g in gaps] == [
        (160, 400, "align.log"), (500, 520, "align.data"), (550, 900, "align.data")]
    assert gaps[0].before == "add" and gaps[0].after == "gemm2"


def test_the_report_sums_per_step_and_per_phase():
    r = gap_report(TRACE, steps=2, min_us=15)
    assert r["gaps"] == 3 and r["span_ms"] == 0.91
    assert abs(r["idle_ms_per_step"] - (240 + 20 + 350) / 2e3) < 1e-12
    assert r["idle_ms_per_step_by_phase"] == {"align.data": 0.185, "align.log": 0.12}
    assert r["largest"][0]["phase"] == "align.data" and r["largest"][0]["ms"] == 0.35
    assert "align.data 0.18" in format_gaps(r)


def test_a_gap_outside_every_phase_is_said_so_and_small_gaps_are_ignored():
    r = gap_report([k(0, 10), k(110, 10), k(125, 1)], steps=1, min_us=20)
    assert r["idle_ms_per_step_by_phase"] == {NO_PHASE: 0.1} and r["gaps"] == 1
    assert gap_report([phase(0, 5, "align.x")], steps=1) == {"device_events": 0}


def test_the_largest_gaps_name_the_host_ops_open_innermost_first():
    """160..400 is the aten::item inside align.log (the phase is not repeated); 550..900 has only
    phases open at its midpoint (725), which the report says rather than guessing."""
    r = gap_report(TRACE + [{"cat": "python_function", "name": "Logger.log", "ts": 150, "dur": 320}],
                   steps=1, min_us=15)
    hosts = {g["ms"]: g["host"] for g in r["largest"]}
    assert hosts[0.24] == "aten::item < Logger.log"
    assert hosts[0.35] == NO_HOST_OP
    assert "host in aten::item < Logger.log" in format_gaps(r)


def test_host_at_keeps_the_innermost_ops_up_to_its_depth():
    ops = sorted([(0.0, 100.0, "outer"), (10.0, 60.0, "middle"), (20.0, 30.0, "inner"), (40.0, 50.0, "later")])
    assert host_at(ops, 25) == "inner < middle < outer"
    assert host_at(ops, 25, depth=1) == "inner"
    assert host_at(ops, 45) == "later < middle < outer"
    assert host_at(ops, 200) == NO_HOST_OP
