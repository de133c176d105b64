"""Preflight: every check that needs no tokenizer, encode or model load, as the playbook's
pre-launch honesty checklist (4.8), run before anything heavy.

    python -m align.preflight [overrides]      # prints the checklist for this config; exit 0 or 2

`align.train` runs the same checks first and stops at the first failure. Checks run cheapest first
(values, git, files: a few ms), then the kwargs checks, which read the installed signatures through
align.signatures (a cache keyed on the files they come from; a miss imports the library). A check is a function `(cfg, ctx) -> Iterable[Check]` listed in CHECKS; a kwargs call
site is a function `(cfg) -> KwargsSite | None` listed in KWARGS_SITES (docs/provenance.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from align.config import TrainConfig
from align.errors import EXIT_CONFIG, AlignError, ConfigError
from align.signatures import Accepted, accepted, resolve

# ------------------------------------------------------------------------------------ results


class Status(StrEnum):
    passed = "PASS"
    failed = "FAIL"
    warned = "WARN"
    na = "N/A"
    """Not checkable by a program for this config; the detail says what to do instead."""


# The playbook's checklist (4.8), in its order: (item id, text, how it is checked here).
CHECKLIST: list[tuple[str, str, str]] = [
    ("tree", "working tree committed", "git diff --quiet && git diff --cached --quiet"),
    ("tests", "test suite green", "and the runner is actually installed"),
    ("cache", "cache key covers the change", "content hashes of data and aux files, encode cache key"),
    ("kwargs", "kwargs checked by NAME", "against the installed library signature"),
    ("config", "config validated", "before tokenizer, encode and model load"),
    ("resolved", "provenance records RESOLVED", "backend, library versions, aux-file shas"),
    ("null", "present-and-null, not absent", "every manifest key present; every null has a reason"),
    ("watchdog", "watchdog tested negative", "kill something and confirm it fires"),
    ("stale", "stale numbers grepped", "for the figure, repo-wide, not just in view"),
]
_ITEMS = {i for i, _, _ in CHECKLIST}


@dataclass
class Check:
    item: str
    """Checklist item id (CHECKLIST)."""
    name: str
    status: Status
    detail: str = ""
    key: Optional[str] = None
    """Config key to name when it fails."""

    @property
    def ok(self) -> bool:
        return self.status != Status.failed

    def error(self) -> ConfigError:
        return ConfigError(self.key or f"preflight[{self.name}]", self.detail)

    def as_dict(self) -> dict[str, Any]:
        return {"item": self.item, "name": self.name, "status": self.status.value, "detail": self.detail}


def _item_status(checks: Sequence[Check]) -> Status:
    for s in (Status.failed, Status.warned, Status.passed):
        if any(c.status == s for c in checks):
            return s
    return Status.na


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    def __iter__(self):
        return iter(self.checks)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def item(self, item: str) -> Status:
        return _item_status([c for c in self.checks if c.item == item])

    def as_list(self) -> list[dict[str, Any]]:
        return [c.as_dict() for c in self.checks]

    def render(self) -> str:
        lines = []
        for item, text, how in CHECKLIST:
            checks = [c for c in self.checks if c.item == item]
            st = _item_status(checks)
            box = {"PASS": "[x]", "FAIL": "[!]", "WARN": "[~]", "N/A": "[-]"}[st.value]
            lines.append(f"{box} {text:<30} {st.value:<4}  ({how})")
            for c in checks:
                detail = f": {c.detail}" if c.detail else ""
                lines.append(f"      {c.status.value:<4} {c.name}{detail}")
        n = {s: sum(1 for c in self.checks if c.status == s) for s in Status}
        verdict = "PASS" if self.ok else "FAIL"
        lines.append(f"preflight {verdict}: {n[Status.passed]} passed, {n[Status.failed]} failed, "
                     f"{n[Status.warned]} warnings, {n[Status.na]} not checkable here ({self.seconds:.2f} s)")
        return "\n".join(lines)


class _Stop(Exception):
    def __init__(self, check: Check) -> None:
        self.check = check


@dataclass
class Context:
    """What checks share: where the code lives (its git tree is the one that must be clean)."""

    root: Path
    stop_on_fail: bool
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> None:
        assert check.item in _ITEMS, check.item
        self.checks.append(check)
        if self.stop_on_fail and check.status == Status.failed:
            raise _Stop(check)


# ------------------------------------------------------------------------------ kwargs by name


@dataclass
class KwargsSite:
    """One library call align makes with kwargs built from config (playbook 4.2)."""

    target: Union[str, Callable]
    """The installed callable, or its import path "module:qualname": read from align.signatures' cache,
    imported only on a miss. A site that names the path keeps `align.train`'s refusals import-free."""
    kwargs: dict[str, Any]
    """The kwargs exactly as the call site builds them (same builder function)."""
    key: str
    """Config key named in the error (what the user changes)."""
    also: tuple[Union[str, Callable], ...] = ()
    """Callables that receive this one's leftover **kwargs (their names are accepted too)."""
    exact: Optional[Callable[[], "KwargsSite"]] = None
    """Set when `kwargs` is the union over the devices the run may get (trainer.device=auto: deciding
    imports torch, ~1 s): builds the site for this machine's device, only when the union is refused."""


def accepted_names(fn: Union[str, Callable]) -> set[str]:
    return accepted(fn).names


def unknown_kwargs(site: KwargsSite) -> tuple[list[str], Accepted]:
    acc = accepted(site.target)
    for other in site.also:
        o = accepted(other)
        acc = Accepted(acc.names | o.names, f"{acc.how}; + {o.name} ({o.how})", acc.name)
    return sorted(set(site.kwargs) - acc.names), acc


def check_kwargs(fn: Union[str, Callable], kwargs: dict[str, Any], what: str, also: tuple = ()) -> None:
    """Fail by NAME when `fn`, as installed, does not accept a key of `kwargs` (playbook 4.2)."""
    unknown, acc = unknown_kwargs(KwargsSite(fn, kwargs, what, also))
    if unknown:
        raise ConfigError(what, f"{acc.name} does not accept {unknown}; it accepts: {', '.join(sorted(acc.names))}")


def check_site(name: str, site: KwargsSite) -> Check:
    try:
        unknown, acc = unknown_kwargs(site)
    except Exception as e:  # the callable is missing or not importable: that is a failure too
        return Check("kwargs", name, Status.failed, f"cannot read the installed callable {site.target!r}: {type(e).__name__}: {e}", site.key)
    if unknown and site.exact is not None:  # the union over devices was refused: decide on this machine's
        return check_site(name, site.exact())
    if unknown:
        return Check("kwargs", name, Status.failed,
                     f"{acc.name} does not accept {unknown}; it accepts: {', '.join(sorted(acc.names))}", site.key)
    union = "; the names of every device trainer.device=auto may pick" if site.exact else ""
    return Check("kwargs", name, Status.passed, f"{len(site.kwargs)} names ok against {acc.name} ({acc.how}){union}", site.key)


# Kwargs call sites, in the order checked. name -> "module:function"; the function takes the
# TrainConfig and returns a KwargsSite, or None when this config does not make that call.
# Register yours with one line next to the call you add (docs/provenance.md).
KWARGS_SITES: dict[str, str] = {
    "wandb.init": "align.kwargs_sites:wandb_init",
    "wandb model artifact": "align.kwargs_sites:wandb_model_artifact",
    "wandb log_artifact": "align.kwargs_sites:wandb_log_artifact",
    "DataLoader": "align.kwargs_sites:data_loader",
    "optimizer": "align.kwargs_sites:optimizer",
    "model config class": "align.kwargs_sites:model_config",
    "model from_pretrained/_from_config": "align.kwargs_sites:model_load",
    "activation checkpointing": "align.kwargs_sites:activation_checkpointing",
    "lr scheduler": "align.kwargs_sites:scheduler",
    "torch.compile of the blocks": "align.kwargs_sites:compile_blocks",
    "peft LoraConfig": "align.models.checks:lora_site",
    "bitsandbytes 4-bit config": "align.models.checks:qlora_site",
}


def check_kwargs_sites(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    for name, ref in KWARGS_SITES.items():
        try:
            site = resolve(ref)(cfg)
        except AlignError as e:
            yield Check("kwargs", name, Status.failed, str(e), getattr(e, "key", None))
            continue
        except Exception as e:
            yield Check("kwargs", name, Status.failed, f"building the kwargs failed: {type(e).__name__}: {e}")
            continue
        if site is None:
            yield Check("kwargs", name, Status.na, "not called by this config")
        else:
            yield check_site(name, site)


# ------------------------------------------------------------------------------------- checks


def check_git(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.provenance import git_state

    g = git_state(ctx.root)
    if g.commit is None:
        yield Check("tree", "git", Status.warned, f"{g.reason}: the manifest records git as null with this reason")
        return
    where = f"{g.root} @ {g.describe}"
    if not g.dirty:
        yield Check("tree", "git", Status.passed, f"{where} (clean)")
    elif cfg.allow_dirty:
        yield Check("tree", "git", Status.warned,
                    f"{where}: {len(g.changed or [])} changed file(s), allowed by allow_dirty=true; the manifest records dirty + diff sha256")
    else:
        files = ", ".join((g.changed or [])[:5]) + (" ..." if len(g.changed or []) > 5 else "")
        yield Check("tree", "git", Status.failed,
                    f"refusing to start: working tree {g.root} has uncommitted changes ({files}); the recorded commit "
                    f"{g.commit[:12]} would not describe this run. Commit, or pass allow_dirty=true", "git")


def check_tests(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    if importlib.util.find_spec("pytest") is None:
        yield Check("tests", "test runner", Status.warned, "pytest is not installed in this environment: nothing can have run the suite here")
        return
    yield Check("tests", "test runner", Status.passed, "pytest is installed")
    lastfailed = ctx.root / ".pytest_cache" / "v" / "cache" / "lastfailed"
    try:
        failed = json.loads(lastfailed.read_text()) if lastfailed.is_file() else {}
    except (OSError, ValueError):
        failed = {}
    if failed:
        yield Check("tests", "last recorded run", Status.warned, f"{len(failed)} test(s) failing in {lastfailed} (e.g. {next(iter(failed))})")
    else:
        yield Check("tests", "suite", Status.na, "preflight does not run the suite: `make test` before a long run")


def check_files(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.data.sources import source_specs  # stdlib + config only: no torch, no tokenizer

    yield Check("config", "values", Status.passed, "every group type- and value-checked by its dataclass")
    for spec in source_specs(cfg.data):  # every source of a mixture, JSONL or Parquet
        ok = spec.path.is_file()
        yield Check("config", "data file", Status.passed if ok else Status.failed, f"{spec.path}" if ok else f"no such file: {spec.path}",
                    f"{spec.key}.path")
    for m in cfg.data.mask_files:
        ok = Path(m).is_file()
        yield Check("config", "mask file", Status.passed if ok else Status.failed, m if ok else f"no such file: {m}", "data.mask_files")
    if cfg.model.pretrained:
        d = Path(cfg.model.pretrained)
        problem = checkpoint_problem(d)
        yield Check("config", "checkpoint dir", Status.failed if problem else Status.passed,
                    problem or f"{d} (config.json parses; every safetensors file as long as its header says)",
                    "model.pretrained")


def checkpoint_problem(d: Path) -> Optional[str]:
    """Why the HF checkpoint dir `d` cannot load, from its files alone (milliseconds: config.json is
    parsed, each safetensors header is read and its tensor offsets are held against the file size);
    None when nothing is seen. A truncated shard otherwise fails inside from_pretrained, after the
    tokenizer, the encode and the rest of the weights."""
    if not (d.is_dir() and (d / "config.json").is_file()):
        return f"not a readable HF checkpoint dir (needs config.json): {d}"
    problem = _json_problem(d / "config.json")
    if problem:
        return problem
    index = d / "model.safetensors.index.json"
    if index.is_file():
        problem = _json_problem(index)
        if problem:
            return problem
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            return f"{index} has no weight_map"
        shards: dict[str, set[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, set()).add(name)
        for shard, names in sorted(shards.items()):
            problem, held = safetensors_problem(d / shard)
            if problem:
                return problem
            if not names <= held:
                missing = names - held
                return f"{d / shard} lacks {len(missing)} tensor(s) {index.name} places there, e.g. {min(missing)}"
        return None
    if (d / "model.safetensors").is_file():
        return safetensors_problem(d / "model.safetensors")[0]
    if any(d.glob("pytorch_model*.bin")):
        return None  # torch pickles: nothing to read without loading them
    return f"no weights in {d} (looked for model.safetensors, model.safetensors.index.json, pytorch_model*.bin)"


def _json_problem(path: Path) -> Optional[str]:
    try:
        value = json.loads(path.read_text())
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    except UnicodeDecodeError:
        return f"{path} is not text (not a JSON file)"
    except ValueError as e:
        return f"{path} is not valid JSON: {e}"
    return None if isinstance(value, dict) else f"{path} holds a JSON {type(value).__name__}, not an object"


def safetensors_problem(path: Path) -> tuple[Optional[str], set[str]]:
    """(why `path` is not a whole safetensors file or None, the tensor names its header holds). The
    format: an 8-byte little-endian header length, a JSON header giving each tensor's byte range in
    the data that follows, and that data, which must end where the last range ends."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or n > size - 8:
                return f"{path} is truncated or not a safetensors file: {size} bytes, header claims {n}", set()
            header = json.loads(f.read(n))
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}", set()
    except ValueError as e:
        return f"{path}: its safetensors header is not valid JSON ({e})", set()
    try:
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return f"{path}: its safetensors header has no valid data_offsets", set()
    if 8 + n + end != size:
        how = "truncated" if 8 + n + end > size else "longer than its header says"
        return f"{path} is {how}: {size} bytes, its header places tensor data up to byte {8 + n + end}", set(tensors)
    return None, set(tensors)


def check_attention(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """The family/machine support rule lives in align.models.attention (the build uses the same one)."""
    from align.config import Fallback
    from align.models.attention import unsupported_reason

    def device_type() -> str:  # only the flash rule asks; resolving trainer.device=auto imports torch
        from align.parallel.env import resolve_device

        return resolve_device(cfg.trainer.device).type

    impl = cfg.attention.implementation
    reason = unsupported_reason(cfg.model.family, impl, device_type)
    if reason is None:
        yield Check("config", "attention backend", Status.passed,
                    f"{cfg.model.family.value} supports {impl.value} (requested; the resolved one is recorded)")
    elif cfg.attention.fallback == Fallback.allow:
        yield Check("config", "attention backend", Status.warned,
                    f"{reason}; fallback=allow: the library picks, the manifest records what it resolved to",
                    "attention.implementation")
    else:
        yield Check("config", "attention backend", Status.failed, reason, "attention.implementation")


def check_cache(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.data.sources import source_path
    from align.data.tokenizer import tokenizer_dir
    from align.provenance import sha256_file, tokenizer_hashes

    p = source_path(cfg.data)
    if p.is_file():
        yield Check("cache", "data content hash", Status.passed, f"{p.name} sha256 {sha256_file(p)[:16]}")
    else:
        yield Check("cache", "data content hash", Status.failed, f"cannot hash the data: no such file: {p}", "data.path")
    tok_sha, tmpl_sha, _ = tokenizer_hashes(tokenizer_dir(cfg.model))
    if tok_sha:
        yield Check("cache", "tokenizer + chat template hashes", Status.passed,
                    f"tokenizer {tok_sha[:16]}, template {tmpl_sha[:16] if tmpl_sha else 'none'}")
    try:
        key = encode_cache_key(cfg)
    except AlignError as e:  # a file the key covers is missing or unreadable
        yield Check("cache", "encode cache key", Status.failed, f"cannot compute: {e}", getattr(e, "key", None))
        return
    if key is None:
        yield Check("cache", "encode cache key", Status.na, "this build has no encode cache: every run encodes from scratch")
    else:
        yield Check("cache", "encode cache key", Status.passed, f"{key[:16]} (content hashes, not paths; align.data.cache)")


def encode_cache_key(cfg: TrainConfig) -> Optional[str]:
    """The key of the encode cache entry this config will use, from files only (align.data.cache,
    when this build has an encode cache); None when it has none."""
    parts = _optional("align.data.cache", "cache_key_parts")
    return None if parts is None else parts(cfg.data, cfg.model)["key"]


def _optional(module: str, attr: str) -> Optional[Callable]:
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


def check_manifest_schema(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.provenance import SCHEMA_VERSION, key_paths, manifest_paths, skeleton

    keys = set(key_paths())
    need = {"model.attn_implementation_resolved", "model.experts_implementation_resolved", "model.sdpa_kernel_family",
            "versions.torch", "versions.transformers", "data.aux_files", "data.sha256", "git.commit", "git.dirty"}
    missing = sorted(need - keys)
    yield Check("resolved", "manifest schema", Status.failed if missing else Status.passed,
                f"schema lacks {missing}" if missing else f"schema v{SCHEMA_VERSION}: {len(keys)} keys incl. resolved backends, versions, aux-file shas")
    sk = skeleton()
    got = set(manifest_paths(sk))
    unreasoned = [p for p in got if p not in ("schema_version", "null_reasons", "status") and p not in sk["null_reasons"]]
    bad = sorted(got ^ keys) + unreasoned
    yield Check("null", "manifest skeleton", Status.failed if bad else Status.passed,
                f"skeleton differs from schema at {bad}" if bad else f"all {len(keys)} keys present at start; every null carries a reason")


def check_watchdog(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    yield Check("watchdog", "watchdog", Status.na, f"parallel={cfg.parallel.kind.value}: no supervisor watches this run")


def check_stale(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    yield Check("stale", "stale numbers", Status.na, "a human step: grep the repo for any figure you changed")


def check_device(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.config import Device

    if cfg.trainer.device != Device.cuda:
        return
    import torch

    ok = torch.cuda.is_available()
    yield Check("config", "device", Status.passed if ok else Status.failed,
                "CUDA available" if ok else "trainer.device=cuda but torch sees no CUDA device", "trainer.device")


# Cheapest first: values, git and files fail in milliseconds, before any library import.
# Each entry is a check function or its "module:function" path; register a new one with one line.
CHECKS: list[Union[str, Callable[[TrainConfig, Context], Iterable[Check]]]] = [
    check_files,
    check_git,
    check_tests,
    check_cache,
    check_manifest_schema,
    check_watchdog,
    check_stale,
    check_attention,
    check_device,
    check_kwargs_sites,
    "align.models.checks:model_checks",
]


def collect(cfg: TrainConfig, root: Path | None = None, stop_on_fail: bool = False) -> Report:
    """Run every check; with `stop_on_fail`, stop at the first failure (align.train)."""
    from align.provenance import code_root

    t0 = time.perf_counter()
    ctx = Context(root=root or code_root(), stop_on_fail=stop_on_fail)
    try:
        for check in CHECKS:
            for c in resolve(check)(cfg, ctx):
                ctx.add(c)
    except _Stop:
        pass
    return Report(ctx.checks, time.perf_counter() - t0)


def run_preflight(cfg: TrainConfig, root: Path | None = None) -> Report:
    """The checks `align.train` runs first: raise ConfigError (exit 2) at the first failure."""
    report = collect(cfg, root=root, stop_on_fail=True)
    if not report.ok:
        raise report.failures[0].error()
    return report


# ------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    from align.cli import validate_command_line
    from align.config import to_typed

    argv = list(sys.argv[1:] if argv is None else argv)
    code = 0
    for cfg in validate_command_line(argv):
        typed = cfg if isinstance(cfg, TrainConfig) else to_typed(cfg)
        m = typed.model
        print(f"align preflight: model={m.family.value}/{m.pretrained or m.preset.value} attention={typed.attention.implementation.value} "
              f"optimizer={typed.optimizer.name.value} data={typed.data.source.value} logger={typed.logger.kind.value} "
              f"overrides: {' '.join(argv) or '(none)'}")
        report = collect(typed)
        print(report.render(), flush=True)
        if not report.ok:
            code = EXIT_CONFIG
    return code


if __name__ == "__main__":
    raise SystemExit(main())
