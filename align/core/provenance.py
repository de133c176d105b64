"""Facts a record states about the code and the host it ran on, shared by the run's manifest
(align/run/manifest.py) and an eval's eval.json (align/evaluation/eval_record.py): the git state of the
checkout, the installed versions, the device, the UTC time, and the manifest's file name.

Nothing here imports torch at import time (`versions` and `device_info` import it when called).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

MANIFEST = "provenance.json"

# ------------------------------------------------------------------------------------------ git


@dataclass
class GitState:
    root: Optional[str] = None
    commit: Optional[str] = None
    describe: Optional[str] = None
    branch: Optional[str] = None
    dirty: Optional[bool] = None
    diff_sha256: Optional[str] = None
    changed: Optional[list[str]] = None
    reason: Optional[str] = None
    """Why the fields are null (not a checkout, git missing)."""


def code_root() -> Path:
    """The directory holding the `align` package that is running: the code whose commit we record."""
    return Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # ranks may ask at once: take no index lock
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, env=env, timeout=30)


def git_state(root: Path | None = None) -> GitState:
    """HEAD, describe, and whether tracked or staged changes exist (untracked files do not count)."""
    root = root or code_root()
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
    except FileNotFoundError:
        return GitState(reason="git is not installed")
    if top.returncode != 0:
        return GitState(reason=f"not a git checkout: {root}")
    st = GitState(root=top.stdout.decode().strip())
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if head.returncode != 0:
        st.reason = f"git checkout {st.root} has no commit yet"
        return st
    st.commit = head.stdout.decode().strip()
    st.describe = _git(root, "describe", "--always", "--dirty").stdout.decode().strip() or None
    br = _git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    st.branch = br.stdout.decode().strip() if br.returncode == 0 else None
    unstaged = _git(root, "diff", "--quiet").returncode != 0
    staged = _git(root, "diff", "--cached", "--quiet").returncode != 0
    st.dirty = unstaged or staged
    st.changed = []
    if st.dirty:
        st.diff_sha256 = hashlib.sha256(_git(root, "diff", "HEAD", "--binary").stdout).hexdigest()
        st.changed = _git(root, "diff", "HEAD", "--name-only").stdout.decode().split()
    return st


# ------------------------------------------------------------------------------------ versions

_DISTS = {"align": "align", "transformers": "transformers", "hydra": "hydra-core", "omegaconf": "omegaconf",
          "bitsandbytes": "bitsandbytes", "torchao": "torchao", "peft": "peft", "wandb": "wandb",
          "safetensors": "safetensors", "tokenizers": "tokenizers", "numpy": "numpy",
          "huggingface_hub": "huggingface_hub"}


def versions() -> tuple[dict[str, Any], dict[str, str]]:
    """Installed versions (from the distributions' metadata, no imports) and reasons for nulls."""
    out: dict[str, Any] = {"python": platform.python_version()}
    reasons: dict[str, str] = {}
    for key, dist in _DISTS.items():
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
            reasons[f"versions.{key}"] = f"distribution {dist!r} is not installed"
    import torch

    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    if out["cuda"] is None:
        reasons["versions.cuda"] = "torch was built without CUDA"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out["cudnn"] = cudnn
    if cudnn is None:
        reasons["versions.cudnn"] = "cuDNN is not available to this torch build"
    return out, reasons


def device_info(device: Any) -> tuple[dict[str, Any], dict[str, str]]:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        idx = device.index or 0
        return {"type": "cuda", "name": torch.cuda.get_device_name(idx),
                "capability": list(torch.cuda.get_device_capability(idx)), "count": torch.cuda.device_count()}, {}
    name = _cpu_name()
    return ({"type": "cpu", "name": name, "capability": None, "count": os.cpu_count()},
            {"device.capability": "CPU: a compute capability is a CUDA notion"})


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------------------------- time


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
