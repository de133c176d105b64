"""`make setup`'s choice of torch build: print the `pip install` arguments for torch on this machine.

    python scripts/torch_args.py SPEC CPU_INDEX      # e.g. torch==2.13.0 https://download.pytorch.org/whl/cpu

pip takes whatever build the configured indexes serve for SPEC: on a plain PyPI index a Linux x86_64
torch is a CUDA build (several GB of nvidia-* wheels), whatever the machine has. So on a machine with
no NVIDIA driver (no `nvidia-smi`), this asks pip which wheel it would take (a dry run: metadata
only, nothing downloaded or installed). A CPU build (what a machine with a local CPU wheel, like
this project's CI, resolves to) is kept: SPEC alone, the command set-up always ran. A CUDA build is
replaced by the same SPEC from CPU_INDEX when that index serves it; when it does not (unreachable,
no such version) SPEC alone again, with a warning on stderr. Never fails: the install that follows
reports any real problem. Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

Resolve = Callable[[list[str]], Optional[dict[str, Any]]]


def is_cuda_build(item: dict[str, Any]) -> bool:
    """A pip report's install item is a CUDA build: a `+cu` local version or nvidia-* requirements."""
    meta = item.get("metadata", {})
    if "+cu" in str(meta.get("version", "")):
        return True
    return any(str(r).lower().startswith("nvidia-") for r in meta.get("requires_dist", []) or [])


def resolve(args: list[str]) -> Optional[dict[str, Any]]:
    """The wheel pip would install for `args` (a dry run), or None when pip cannot say."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
               "--timeout", "15", "--retries", "1", "--report", str(report), *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError):
            return None
        if p.returncode != 0 or not report.is_file():
            return None
        items = json.loads(report.read_text()).get("install", [])
        return items[0] if items else None


def choose(spec: str, cpu_index: str, has_gpu: bool, resolve: Resolve = resolve) -> tuple[list[str], Optional[str]]:
    """(pip arguments, warning or None)."""
    if has_gpu or not cpu_index:
        return [spec], None
    default = resolve([spec])
    if default is None or not is_cuda_build(default):
        return [spec], None
    cpu = resolve(["--index-url", cpu_index, spec])
    if cpu is not None and not is_cuda_build(cpu):
        return ["--index-url", cpu_index, spec], None
    return [spec], (f"torch_args: no NVIDIA driver here, but the configured index serves {spec} as a CUDA build and "
                    f"{cpu_index} does not serve a CPU one: installing the CUDA build (several GB). "
                    "Set TORCH_INDEX=<an index with a CPU build> to choose.")


def main(argv: list[str]) -> int:
    spec, cpu_index = argv[0], argv[1] if len(argv) > 1 else ""
    args, warning = choose(spec, cpu_index, has_gpu=shutil.which("nvidia-smi") is not None)
    if warning:
        print(warning, file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
