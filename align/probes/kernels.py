"""`python -m align.tools.probe probe=kernels`: where the device time goes, kernel by kernel.

torch.profiler over real trainer steps. `key_averages()` lists the ATen op AND the kernel it
launched, each carrying the same self device time, so summing the table gives ~2x the step (the
tell is exact equality between an `aten::` row and a kernel row). Only DEVICE-KERNEL rows
are kept, grouped attention / GEMM / elementwise / memcpy / comm / other, and their total is checked
against the measured wall clock of the same steps (80-105% is the right shape).

Also flagged: kernels built for an older architecture than the device (an `_sm80` name on sm_90:
"selected correctly, a generation behind"), fallback variants (`gmem`: the global-memory
tier of the memory-efficient path), and kernel launches per step, which settles "did this flag take
effect?" (a per-expert loop leaves n_experts launches per layer, a grouped path one).

The table logic (`ProfRow`, `parse_table`, `kernel_table`) is pure and tested on a recorded-format
fixture; `run` profiles.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from align.config import TrainConfig
from align.plan.planner import Plan
from align.probes.gaps import format_gaps, gap_report

WALL_OK = (0.80, 1.05)
"""Filtered kernel total / measured wall time: outside this, the table is not describing the step
(under ~80%: idle gaps, launch-bound or host-bound; over ~105%: double counting or overlapping streams)."""


@dataclass
class ProfRow:
    name: str
    calls: int
    self_device_us: float
    is_device: Optional[bool] = None
    """From the profiler when live (a device event that is not a user annotation); None when the row
    was parsed from a printed table, where only the name tells."""
    flops: float = 0.0


# ------------------------------------------------------------------------------ which rows are kernels

# Host-side rows: ATen ops, autograd nodes, runtime API calls, profiler/user ranges.
_HOST = re.compile(
    r"^(aten::|autograd::|torch::|c10d::|c10::|Optimizer\.|ProfilerStep#|## |enumerate\(DataLoader\)|"
    r"cuda[A-Z]\w*$|cu[A-Z]\w*$|nccl:|record_param_comms|Activity Buffer|Lazy Function Loading|"
    r"Unrecognized|\[memory\]|<built-in|nn\.Module:)"
    r"|^\w+Backward\d*$"
)
# Device kernels and device copies by their symbols.
_DEVICE = re.compile(
    r"^(void |Memcpy |Memset |fmha|cutlass|sm\d{2,3}_|ampere_|volta_|turing_|hopper_|nvjet|triton_|flash|"
    r"cudnn|xmma|gemm|gemv|nccl[A-Z]|ncclDevKernel|pytorch_flash|at::native::|cublas|cask_|kernel_)"
    r"|(_kernel|Kernel\d*)(<|\(|$)"
)


def is_device_kernel(row: ProfRow) -> bool:
    if row.is_device is not None:
        return row.is_device
    return bool(_DEVICE.search(row.name)) and not _HOST.search(row.name)


# Ordered: the first group whose pattern matches wins.
GROUPS: list[tuple[str, re.Pattern]] = [
    ("memcpy", re.compile(r"^(Memcpy|Memset)", re.I)),
    ("comm", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"fmha|flash|attention|_sdpa|sdpa_|mha_|cudnn.*(fprop|bprop|sdpa)", re.I)),
    ("gemm", re.compile(r"gemm|gemv|xmma|nvjet|cublas|cutlass|s16816|s1688|wgmma|splitK|dot_kernel", re.I)),
    ("elementwise", re.compile(r"elementwise|triton_poi|multi_tensor_apply|foreach|fill_kernel", re.I)),
]


DISPLAY_ORDER = ["attention", "gemm", "elementwise", "memcpy", "comm", "other"]


def kernel_group(name: str) -> str:
    for group, pat in GROUPS:
        if pat.search(name):
            return group
    return "other"


_ARCH_PATTERNS = [
    re.compile(r"(?:^|[_:\s])sm_?(\d{2,3})a?(?=[_\W]|$)", re.I),
    re.compile(r"cutlass_(\d{2,3})_", re.I),
]
_ARCH_PREFIX = {"volta_": 70, "turing_": 75, "ampere_": 80, "hopper_": 90}


def kernel_arch(name: str) -> Optional[int]:
    """The SM architecture a kernel was built for, when its symbol says (`_sm80`, `sm90_xmma`,
    `cutlass_80_`, `ampere_`); None when it does not."""
    for pat in _ARCH_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    for prefix, arch in _ARCH_PREFIX.items():
        if name.lower().startswith(prefix):
            return arch
    return None


_FALLBACK = re.compile(r"(^|_)gmem(_|$)|fallback", re.I)


def is_fallback(name: str) -> bool:
    return bool(_FALLBACK.search(name))


# --------------------------------------------------------------------------------------- the table


@dataclass
class KernelTable:
    steps: int
    wall_s: Optional[float]
    device_arch: Optional[int]
    kernels: list[dict] = field(default_factory=list)
    """Device-kernel rows, by time: name, calls, ms, group, arch."""
    groups: dict[str, dict] = field(default_factory=dict)
    """group -> {ms, pct of kernel total}."""
    total_ms: float = 0.0
    unfiltered_ms: float = 0.0
    """Every row's self device time summed: what naive summing of key_averages() reports."""
    duplicates: list[tuple[str, str, float]] = field(default_factory=list)
    """(host row, kernel row, us) pairs with exactly equal self device time: the double-counting tell."""
    wall_ratio: Optional[float] = None
    wall_ok: Optional[bool] = None
    old_arch: list[dict] = field(default_factory=list)
    fallback: list[dict] = field(default_factory=list)
    launches_per_step: float = 0.0
    """Kernel launches (copies and memsets excluded) per profiled step."""
    copies_per_step: float = 0.0
    unclassified_with_device_time: list[str] = field(default_factory=list)
    """Rows neither kernel nor known host op that carry device time: shown, never silently dropped."""
    profiler_flops: float = 0.0
    """FLOPs torch.profiler attributes to host ops (matmuls; attention kernels are not counted)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_table(rows: Iterable[ProfRow], steps: int, wall_s: Optional[float] = None,
                 device_arch: Optional[int] = None) -> KernelTable:
    rows = list(rows)
    kern = [r for r in rows if is_device_kernel(r)]
    host = [r for r in rows if not is_device_kernel(r)]
    t = KernelTable(steps=steps, wall_s=wall_s, device_arch=device_arch)
    t.unfiltered_ms = sum(r.self_device_us for r in rows) / 1e3
    t.total_ms = sum(r.self_device_us for r in kern) / 1e3
    by_time = {r.self_device_us: r.name for r in kern if r.self_device_us > 0}
    t.duplicates = [(h.name, by_time[h.self_device_us], h.self_device_us) for h in host
                    if h.self_device_us > 0 and h.self_device_us in by_time]
    t.unclassified_with_device_time = [r.name for r in host if r.self_device_us > 0 and not _HOST.search(r.name)
                                       and r.is_device is None]
    t.profiler_flops = sum(r.flops for r in host)
    for r in sorted(kern, key=lambda r: -r.self_device_us):
        g, arch = kernel_group(r.name), kernel_arch(r.name)
        row = {"name": r.name, "calls": r.calls, "ms": r.self_device_us / 1e3, "group": g, "arch": arch}
        t.kernels.append(row)
        if device_arch is not None and arch is not None and arch < device_arch:
            t.old_arch.append(row)
        if is_fallback(r.name):
            t.fallback.append(row)
    for g in DISPLAY_ORDER:
        ms = sum(k["ms"] for k in t.kernels if k["group"] == g)
        t.groups[g] = {"ms": ms, "pct": ms / t.total_ms if t.total_ms else 0.0}
    t.launches_per_step = sum(k["calls"] for k in t.kernels if k["group"] != "memcpy") / steps
    t.copies_per_step = sum(k["calls"] for k in t.kernels if k["group"] == "memcpy") / steps
    if wall_s and kern:
        t.wall_ratio = t.total_ms / 1e3 / wall_s
        t.wall_ok = WALL_OK[0] <= t.wall_ratio <= WALL_OK[1]
    return t


def format_table(t: KernelTable, top: int = 20) -> str:
    lines = [f"device kernels over {t.steps} profiled steps (device-kernel rows only; aten/host rows excluded)", "",
             "| group | ms | % of kernel time | ms/step |", "|---|---|---|---|"]
    for g, v in t.groups.items():
        if v["ms"] or g in ("attention", "gemm", "elementwise", "memcpy", "other"):
            lines.append(f"| {g} | {v['ms']:,.3f} | {v['pct']:.1%} | {v['ms'] / t.steps:,.3f} |")
    lines.append(f"| total | {t.total_ms:,.3f} | 100% | {t.total_ms / t.steps:,.3f} |")
    lines.append("")
    if t.wall_s:
        verdict = "OK" if t.wall_ok else f"FLAG: outside {WALL_OK[0]:.0%}-{WALL_OK[1]:.0%}"
        lines.append(f"kernel total / measured wall = {t.total_ms:,.1f} ms / {t.wall_s * 1e3:,.1f} ms = "
                     f"{t.wall_ratio:.1%} ({verdict})")
    lines.append(f"naive sum of every key_averages() row = {t.unfiltered_ms:,.1f} ms "
                 f"({t.unfiltered_ms / t.total_ms if t.total_ms else float('nan'):.2f}x the kernel total); "
                 f"{len(t.duplicates)} host rows carry exactly a kernel row's time (double counting avoided)")
    lines.append(f"kernel launches per step: {t.launches_per_step:,.1f} (+ {t.copies_per_step:,.1f} copies/memsets)")
    if t.device_arch is not None:
        if t.old_arch:
            lines.append(f"FLAG: {len(t.old_arch)} kernel(s) built for an older arch than the device's "
                         f"sm_{t.device_arch} "
                         f"({sum(k['ms'] for k in t.old_arch) / t.total_ms:.1%} of kernel time):")
            lines += [f"    sm_{k['arch']}  {k['ms']:,.3f} ms  {k['name'][:140]}" for k in t.old_arch[:10]]
        else:
            lines.append(f"no kernel names an older arch than sm_{t.device_arch}")
    if t.fallback:
        lines.append(f"FLAG: {len(t.fallback)} fallback-variant kernel(s) (gmem / fallback):")
        lines += [f"    {k['ms']:,.3f} ms  {k['name'][:140]}" for k in t.fallback[:10]]
    if t.unclassified_with_device_time:
        lines.append(f"note: rows with device time that are neither a known kernel nor a host op: "
                     f"{t.unclassified_with_device_time[:5]}")
    lines += ["", f"top {min(top, len(t.kernels))} kernels:", "", "| ms | calls | group | arch | kernel |",
              "|---|---|---|---|---|"]
    for k in t.kernels[:top]:
        lines.append(f"| {k['ms']:,.3f} | {k['calls']} | {k['group']} | {k['arch'] or ''} | `{k['name'][:120]}` |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- reading profiler output


def rows_from_events(events: Iterable[Any]) -> list[ProfRow]:
    """Rows from `prof.key_averages()`, with the profiler's own device/host split."""
    from torch.autograd import DeviceType

    out = []
    for e in events:
        dev = (getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU
               and not getattr(e, "is_user_annotation", False))
        out.append(ProfRow(name=e.key, calls=int(e.count),
                           self_device_us=float(getattr(e, "self_device_time_total", 0.0)),
                           is_device=bool(dev), flops=float(getattr(e, "flops", 0) or 0)))
    return out


_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}


def _us(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else 0.0


def parse_table(text: str) -> list[ProfRow]:
    """Rows of a printed `key_averages().table()` (torch's fixed-width format): the column spans come
    from the dashed rule under the header. Names longer than the column are truncated by torch, so
    print with a wide `max_name_column_width` (the probe writes profile_table.txt that way)."""
    lines = text.splitlines()
    hi = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("Name") and "# of Calls" in ln)
    rule = lines[hi + 1]
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    # Header titles can overflow their column by a character ("CUDA time avg" in 12): split on gaps.
    header = re.split(r"\s{2,}", lines[hi].strip())
    if len(header) != len(spans):
        raise ValueError(f"table header has {len(header)} titles but {len(spans)} columns")
    dev_col = next(i for i, h in enumerate(header)
                   if h.startswith("Self ") and not h.startswith("Self CPU") and not h.endswith("%")
                   and "Mem" not in h)
    calls_col = header.index("# of Calls")
    rows = []
    for ln in lines[hi + 2:]:
        if not ln.strip() or set(ln.strip()) <= {"-", " "}:
            break
        cells = [ln[a:b].strip() for a, b in spans]
        rows.append(ProfRow(name=cells[0], calls=int(cells[calls_col]), self_device_us=_us(cells[dev_col])))
    return rows


# ------------------------------------------------------------------------------------------- run


def run(cfg: TrainConfig, out_dir: Path, plan: Optional[Plan] = None) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from align.probes.common import build_trainer, model_summary, sync, train_step, write_json
    from align.telemetry.throughput import format_mfu, rates

    pc = cfg.probe.kernels
    trainer = build_trainer(cfg, out_dir, plan)
    device = trainer.env.device
    cuda = device.type == "cuda"
    arch = None
    if cuda:
        major, minor = torch.cuda.get_device_capability(device)
        arch = major * 10 + minor
    print(f"kernels probe: {trainer.model_info['model_class']} on {device}"
          f"{f' (sm_{arch})' if arch else ''}: {pc.warmup} warm-up, {pc.timed_steps} timed, {pc.steps} profiled steps",
          flush=True)

    batches = iter(trainer.stream)

    def step() -> dict[str, Any]:  # as fit() runs it: the history row is part of the step's host work
        m = train_step(trainer, batches)
        trainer.log(m)
        return m

    for _ in range(pc.warmup):
        step()
    timed = [step() for _ in range(pc.timed_steps)]
    tp = trainer.throughput
    thr = rates(sum(m["tokens"] for m in timed), sum(m["real_tokens"] for m in timed),
                sum(m["loss_tokens"] for m in timed),
                sum(m["model_flops"] for m in timed), sum(m["step_time_s"] for m in timed),
                tp.ceiling, tp.datasheet_tflops)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_flops=True) as prof:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(pc.steps):
            step()
        sync(device)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    (out_dir / "profile_table.txt").write_text(
        events.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                     row_limit=-1, max_name_column_width=400))
    rows = rows_from_events(events)
    write_json(out_dir / "profile_rows.json", [asdict(r) for r in rows])
    trace = out_dir / "trace.json"
    gaps = None
    if cuda:  # where the device waited, from the trace's timeline
        prof.export_chrome_trace(str(trace))
        gaps = gap_report(json.loads(trace.read_text())["traceEvents"], pc.steps)
        if not pc.trace:
            trace.unlink()
    elif pc.trace:
        prof.export_chrome_trace(str(trace))

    table = kernel_table(rows, pc.steps, wall, arch)
    split = {g: v["pct"] for g, v in table.groups.items()}
    report = {"probe": "kernels", "model": model_summary(trainer), "device_arch": arch,
              "throughput_unprofiled": thr, "throughput_convention": tp.describe(),
              "profiled_wall_s": wall, "kernel_table": table.to_dict(), "time_split": split if table.kernels else None,
              "idle_gaps": gaps}
    if not table.kernels:
        reason = (f"NO DEVICE KERNELS: this run is on {device.type}; device kernels exist only on a CUDA device. "
                  f"The host-op table (not kernels) is in profile_table.txt.") if not cuda else (
                  "NO DEVICE KERNELS were recorded on a CUDA device: the profiler's CUDA activity did not report "
                  "(CUPTI unavailable?); nothing below describes the GPU")
        report["reason"] = reason
        text = f"# kernels probe\n\n{reason}\n"
    else:
        text = "# kernels probe\n\n" + format_table(table)
    text += (f"\nthroughput (unprofiled steps): tokens/s {thr['tokens_per_s']:,.0f}, real tokens/s "
             f"{thr['real_tokens_per_s']:,.0f}, loss tokens/s {thr['loss_tokens_per_s']:,.0f}, model FLOPs/token "
             f"{thr['flops_per_token']:,.0f}, achieved {thr['achieved_tflops']:.3f} TFLOP/s; MFU: {format_mfu(thr)}\n")
    if table.kernels:
        text += "time split (share of kernel time): " + ", ".join(f"{g} {p:.1%}" for g, p in split.items() if p) + "\n"
        if table.profiler_flops:
            text += (f"profiler-counted FLOPs (matmul ops only): {table.profiler_flops / pc.steps:.3e}/step = "
                     f"{table.profiler_flops / wall / 1e12:.3f} TFLOP/s over the profiled wall "
                     f"(with profiler overhead)\n")
    if gaps is not None:
        text += format_gaps(gaps)
    write_json(out_dir / "kernels.json", report)
    (out_dir / "kernels.md").write_text(text)
    print(text, flush=True)
    trainer.history.close()
    print(f"wrote {out_dir / 'kernels.json'}, kernels.md, profile_table.txt, profile_rows.json", flush=True)
    return 0


def load_rows(path: Path) -> list[ProfRow]:
    """Rows written by a previous run's profile_rows.json (re-derive a table without the GPU)."""
    return [ProfRow(**r) for r in json.loads(Path(path).read_text())]
