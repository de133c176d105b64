"""align.core.signatures: a cached answer equals a live read of the installed callable. Any file it was
read from changing makes it a miss, and so does another install or version. A damaged entry is
rebuilt, never trusted. With the cache warm, `align.train` refuses a kwarg without importing torch,
transformers or wandb. Stand-in libraries are written to tmp_path; dropping them from sys.modules
stands in for a new process."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from align.core import signatures
from align.core.signatures import KwargsSite
from align.run.checklist import Status
from align.run.kwargs_sites import check_site

REPO = Path(__file__).resolve().parents[2]

BASE = """
class Base:
    def __init__(self, optimizer, num_warmup_steps=0, warmup_ratio=0.0):
        pass
"""
DECO = """
import functools


def keep(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper
"""
DECO_V5 = """
def keep(fn):  # the wrapper now fixes its own signature
    def wrapper(optimizer, num_warmup_steps=0):
        return fn(optimizer, num_warmup_steps)
    return wrapper
"""
SCHED = """
from sig_lib.base import Base
from sig_lib.deco import keep


def schedule(optimizer, num_warmup_steps=0, warmup_ratio=0.0):
    pass


class Child(Base):
    pass


@keep
def decorated(optimizer, num_warmup_steps=0, warmup_ratio=0.0):
    pass


class Config:
    attribute_map = {"n_layers": "num_hidden_layers"}

    def __init__(self, num_hidden_layers=2, **kwargs):
        self.__post_init__(**kwargs)

    def __post_init__(self, **kwargs):
        self.global_head_dim = kwargs.pop("global_head_dim", None)


class Model:
    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        return kwargs.get("attn_implementation"), "dtype" in kwargs
"""
LOST = "warmup_ratio=0.0"  # what transformers 5 did to TrainingArguments (docs/pitfalls.md#7)
KW = {"num_warmup_steps": 5, "warmup_ratio": 0.05}


class StandIn:
    """The package `sig_lib` (base, deco, sched) under `root`, importable from sys.path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "sig_lib").mkdir(parents=True)
        for name, text in (("__init__", ""), ("base", BASE), ("deco", DECO), ("sched", SCHED)):
            self.write(name, text)

    def path(self, name: str) -> Path:
        return self.root / "sig_lib" / f"{name}.py"

    def write(self, name: str, text: str) -> None:
        self.path(name).write_text(textwrap.dedent(text))
        importlib.invalidate_caches()

    def forget(self) -> None:
        """A new process: nothing of the stand-in imported."""
        for m in [m for m in sys.modules if m == "sig_lib" or m.startswith("sig_lib.")]:
            del sys.modules[m]

    @staticmethod
    def imported() -> bool:
        return "sig_lib.sched" in sys.modules


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(signatures.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no .pyc that could outlive an edit
    return tmp_path / "cache"


@pytest.fixture
def lib(tmp_path, monkeypatch, cache):
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    s = StandIn(tmp_path / "site")
    yield s
    s.forget()


def check(target: str, kwargs=KW):
    return check_site("stand-in", KwargsSite(target, dict(kwargs), "optimizer"))


# ------------------------------------------------------------------------------- hit == live


TARGETS = ["sig_lib.sched:schedule", "sig_lib.sched:Child", "sig_lib.sched:decorated", "sig_lib.sched:Config",
           "sig_lib.sched:Model.from_pretrained"]


def test_a_hit_gives_what_a_live_read_gives_without_importing_the_library(lib, cache):
    live = {t: signatures.inspect_accepted(signatures.resolve(t)) for t in TARGETS}
    assert {"n_layers", "global_head_dim"} <= live["sig_lib.sched:Config"].names  # attribute_map, __post_init__
    assert {"attn_implementation", "dtype"} <= live["sig_lib.sched:Model.from_pretrained"].names  # read from **kwargs
    lib.forget()
    misses = {t: signatures.accepted(t) for t in TARGETS}  # cold: imported, read, written
    assert lib.imported() and len(list(cache.glob("*.json"))) == len(TARGETS)
    lib.forget()
    hits = {t: signatures.accepted(t) for t in TARGETS}
    assert not lib.imported()  # answered from the cache alone
    for t in TARGETS:
        assert vars(hits[t]) == vars(misses[t]) == vars(live[t]), t


# ------------------------------------------------------------------ every input of the key counts


def _lose_warmup_ratio(lib: StandIn, name: str, same_size: bool = False, same_mtime: bool = False) -> None:
    p = lib.path(name)
    before = os.stat(p)
    text = p.read_text()
    if name == "deco":
        text = textwrap.dedent(DECO_V5)
    else:
        text = text.replace(f", {LOST}", " " * len(f", {LOST}") if same_size else "", 1)
    lib.write(name, text)
    after = os.stat(p)
    assert (after.st_size == before.st_size) == same_size
    mtime = before.st_mtime_ns if same_mtime else before.st_mtime_ns + 2_000_000_000
    os.utime(p, ns=(after.st_atime_ns, mtime))


@pytest.mark.parametrize("target,changed,same_size,same_mtime", [
    ("sig_lib.sched:schedule", "sched", True, False),   # an edit of the same size: only mtime tells
    ("sig_lib.sched:schedule", "sched", False, True),   # mtime restored (a copy with -p): only size tells
    ("sig_lib.sched:Child", "base", False, False),      # the class inherits __init__ from another file
    ("sig_lib.sched:decorated", "deco", False, False),  # the decorator lives in another file
], ids=["mtime", "size", "base-class-file", "decorator-file"])
def test_a_changed_file_invalidates_the_entry(lib, target, changed, same_size, same_mtime):
    assert check(target).status == Status.passed  # the old library accepts warmup_ratio; entry written
    lib.forget()
    assert check(target).status == Status.passed and not lib.imported()  # a hit
    _lose_warmup_ratio(lib, changed, same_size, same_mtime)
    c = check(target)  # the stale entry said accepted: it must not be believed
    assert c.status == Status.failed and "['warmup_ratio']" in c.detail and "num_warmup_steps" in c.detail
    lib.forget()
    assert check(target).status == Status.failed and not lib.imported()  # the new answer is cached in turn


def test_the_same_name_in_another_install_is_a_miss(tmp_path, lib, monkeypatch):
    assert check("sig_lib.sched:schedule").status == Status.passed
    lib.forget()
    other = StandIn(tmp_path / "other-site")  # another environment, its own file, nothing stale in it
    _lose_warmup_ratio(other, "sched")
    monkeypatch.syspath_prepend(str(other.root))
    c = check("sig_lib.sched:schedule")
    assert c.status == Status.failed and "['warmup_ratio']" in c.detail


def test_another_installed_version_is_a_miss(lib, monkeypatch):
    monkeypatch.setattr(signatures, "_version", lambda top: "4.57.0")
    signatures.accepted("sig_lib.sched:schedule")
    lib.forget()
    signatures.accepted("sig_lib.sched:schedule")
    assert not lib.imported()
    monkeypatch.setattr(signatures, "_version", lambda top: "5.0.0")  # files look the same, the version does not
    signatures.accepted("sig_lib.sched:schedule")
    assert lib.imported()


def test_a_stand_in_patched_over_the_library_is_read_live_and_never_cached(lib, cache, monkeypatch):
    import sig_lib.sched

    def schedule(optimizer, num_warmup_steps=0):  # defined here, not in the library
        pass

    monkeypatch.setattr(sig_lib.sched, "schedule", schedule)
    assert check("sig_lib.sched:schedule").status == Status.failed
    assert not list(cache.glob("*.json"))  # a later process must read the library, not this test's stand-in


# --------------------------------------------------------------------------- damaged entries


def _damage(entry: Path, how: str) -> None:
    text = entry.read_text()
    if how == "truncated":
        entry.write_text(text[: len(text) // 2])
    elif how == "not json":
        entry.write_bytes(b"\x00\xffgarbage")
    else:  # valid JSON that would accept the lost name: only the checksum tells
        doc = json.loads(text)
        doc["body"]["names"].append("warmup_ratio")
        entry.write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["truncated", "not json", "names edited"])
def test_a_damaged_entry_is_rebuilt_never_trusted(lib, cache, how):
    _lose_warmup_ratio(lib, "sched")
    assert check("sig_lib.sched:schedule").status == Status.failed
    [entry] = cache.glob("*.json")
    good = json.loads(entry.read_text())
    lib.forget()
    _damage(entry, how)
    c = check("sig_lib.sched:schedule")
    assert c.status == Status.failed and "['warmup_ratio']" in c.detail
    assert lib.imported()  # read live again
    assert json.loads(entry.read_text()) == good  # and the entry rewritten whole


# ---------------------------------------------------------------------- device-dependent sites


class AdamWWithoutFused:  # a torch whose AdamW lacks `fused`, which align passes on CUDA only
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        pass


def test_auto_device_checks_the_union_and_resolves_the_device_only_when_refused(monkeypatch):
    import torch

    import align.optim
    from align.config import to_typed
    from align.run.cli import compose
    from align.run.kwargs_sites import optimizer

    auto, cuda = (to_typed(compose(["logger=none", f"trainer.device={d}"])) for d in ("auto", "cuda"))
    assert "fused" in optimizer(auto).kwargs  # checked without knowing the device: the CUDA names too
    assert check_site("optimizer", optimizer(auto)).status == Status.passed
    monkeypatch.setattr(align.optim, "optimizer_target", lambda cfg, sharded=False: f"{__name__}:AdamWWithoutFused")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA, where auto resolves to the CPU")
    # This machine has no CUDA: auto runs on the CPU, where `fused` is not passed, so no refusal...
    assert check_site("optimizer", optimizer(auto)).status == Status.passed
    c = check_site("optimizer", optimizer(cuda))  # ...but on CUDA it is
    assert c.status == Status.failed and "['fused']" in c.detail


# ----------------------------------------------------------------------------- align.train


_DRIVER = """
import atexit, os, runpy, sys
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write("\\n".join(sorted(sys.modules))))
sys.argv = ["align.train", *sys.argv[1:]]
runpy.run_module("align.train", run_name="__main__", alter_sys=True)
"""
HEAVY = {"torch", "transformers", "wandb"}


def _train(tmp_path: Path, run: str, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -m align.train args` (via runpy), and the top-level modules it had imported at exit."""
    out = tmp_path / f"{run}.modules"
    env = {**os.environ, "MODULES_OUT": str(out), signatures.CACHE_ENV: str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", _DRIVER, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    return p, {m.split(".")[0] for m in out.read_text().split()}


def test_a_refused_kwarg_on_a_warm_cache_imports_neither_torch_nor_transformers(tmp_path):
    args = ("+model.overrides.sliding_windw=32", "allow_dirty=true")  # the default config, one misspelt override
    cold, cold_modules = _train(tmp_path, "cold", *args)
    warm, warm_modules = _train(tmp_path, "warm", *args)
    for p in (cold, warm):
        line = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and line.startswith("align: error: model.overrides: ") and "['sliding_windw']" in line
    # the cached names are the live ones
    assert cold.stderr.strip().splitlines()[-1] == warm.stderr.strip().splitlines()[-1]
    assert HEAVY <= cold_modules  # the cold run read the libraries (so this probe sees imports)
    assert not HEAVY & warm_modules, sorted(HEAVY & warm_modules)
