"""Where the device waits: idle time between kernels in a profiler trace, and what the host was doing
meanwhile.

The kernel table says how busy the device was (kernel total / wall); this says where the rest went.
Busy intervals are the union of kernels, copies and memsets over ALL streams (a side stream's kernel
covers a gap of the compute stream), and every gap of at least `min_us` is charged to the innermost
`align.*` phase the host was in at the gap's midpoint (the trainer marks its phases with
`torch.profiler.record_function`): a gap inside `align.log` means the device waited for logging.
The largest gaps also name the host ops open at their midpoint, innermost first (`aten::item <
Gemma4Model.forward`): what the host was busy with while nothing ran, below the phase.

Pure functions over the Chrome-trace events torch.profiler exports (`cat`, `name`, `ts`, `dur` in
microseconds), so they are tested on hand-made traces.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Iterable

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "python_function", "cuda_runtime", "cuda_driver", "user_annotation")
PHASE_PREFIX = "align."
NO_PHASE = "(outside any align phase)"
NO_HOST_OP = "(no host op open: Python between ops)"
HOST_DEPTH = 3
"""How many of the host ops open at a gap's midpoint the report names, innermost first."""


@dataclass(frozen=True)
class Gap:
    start_us: float
    end_us: float
    phase: str
    """The innermost align.* phase the host was in at the gap's midpoint."""
    before: str
    """The device event that ended just before the gap."""
    after: str

    @property
    def us(self) -> float:
        return self.end_us - self.start_us


def busy_intervals(events: Iterable[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """Device events as (start, end, name), merged over streams: overlapping events become one
    interval named by its last event to end."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e["name"]))
                   for e in events if e.get("cat") in DEVICE_CATS)
    merged: list[tuple[float, float, str]] = []
    for s, t, name in spans:
        if merged and s <= merged[-1][1]:
            ps, pt, pname = merged[-1]
            merged[-1] = (ps, max(pt, t), name if t >= pt else pname)
        else:
            merged.append((s, t, name))
    return merged


def _spans(events: Iterable[dict[str, Any]], cats: tuple[str, ...], phases: bool) -> list[tuple[float, float, str]]:
    """Host events of `cats` as sorted (start, end, name): the align.* phases only, or everything else."""
    return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e["name"]))
                  for e in events if e.get("cat") in cats and str(e.get("name", "")).startswith(PHASE_PREFIX) == phases)


def _phases(events: Iterable[dict[str, Any]]) -> list[tuple[float, float, str]]:
    return _spans(events, ("user_annotation",), phases=True)


def phase_at(phases: list[tuple[float, float, str]], t: float) -> str:
    """The innermost (shortest) phase covering time `t`."""
    i = bisect.bisect_right(phases, (t, float("inf"), ""))
    covering = [(end - start, name) for start, end, name in phases[:i] if start <= t <= end]
    return min(covering)[1] if covering else NO_PHASE


def _host_ops(events: Iterable[dict[str, Any]]) -> list[tuple[float, float, str]]:
    return _spans(events, HOST_CATS, phases=False)


def host_at(ops: list[tuple[float, float, str]], t: float, depth: int = HOST_DEPTH) -> str:
    """The host ops open at time `t`, innermost (shortest) first, `depth` of them joined by " < "."""
    i = bisect.bisect_right(ops, (t, float("inf"), ""))
    open_ = sorted((end - start, name) for start, end, name in ops[:i] if start <= t <= end)
    return " < ".join(name[:60] for _, name in open_[:depth]) or NO_HOST_OP


def idle_gaps(events: list[dict[str, Any]], min_us: float = 20.0) -> list[Gap]:
    busy = busy_intervals(events)
    phases = _phases(events)
    gaps = []
    for (_, end, before), (start, _, after) in zip(busy, busy[1:]):
        if start - end >= min_us:
            gaps.append(Gap(end, start, phase_at(phases, (end + start) / 2), before, after))
    return gaps


def gap_report(events: list[dict[str, Any]], steps: int, min_us: float = 20.0, top: int = 5) -> dict[str, Any]:
    busy = busy_intervals(events)
    if not busy:
        return {"device_events": 0}
    span = busy[-1][1] - busy[0][0]
    gaps = idle_gaps(events, min_us)
    ops = _host_ops(events)
    idle = sum(g.us for g in gaps)
    by_phase: dict[str, float] = {}
    for g in gaps:
        by_phase[g.phase] = by_phase.get(g.phase, 0.0) + g.us
    return {
        "device_events": sum(1 for e in events if e.get("cat") in DEVICE_CATS),
        "span_ms": span / 1e3,
        "idle_ms_per_step": idle / 1e3 / steps,
        "idle_share": idle / span if span else None,
        "gaps": len(gaps),
        "min_gap_us": min_us,
        "idle_ms_per_step_by_phase": {k: v / 1e3 / steps for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])},
        "largest": [{"ms": g.us / 1e3, "phase": g.phase, "before": g.before[:90], "after": g.after[:90],
                     "host": host_at(ops, (g.start_us + g.end_us) / 2)}
                    for g in sorted(gaps, key=lambda g: -g.us)[:top]],
    }


def format_gaps(r: dict[str, Any]) -> str:
    if not r.get("device_events"):
        return "device idle: no device events in the trace\n"
    phases = ", ".join(f"{k} {v:.2f}" for k, v in r["idle_ms_per_step_by_phase"].items()) or "-"
    lines = [f"device idle between kernels (gaps >= {r['min_gap_us']:.0f} us, all streams): "
             f"{r['idle_ms_per_step']:.2f} ms/step = {r['idle_share']:.1%} of the profiled span, {r['gaps']} gaps",
             f"by what the host was doing (ms/step): {phases}"]
    for g in r["largest"]:
        lines.append(f"  {g['ms']:.2f} ms in {g['phase']}: after `{g['before']}`, before `{g['after']}`; "
                     f"host in {g.get('host', NO_HOST_OP)}")
    return "\n".join(lines) + "\n"
