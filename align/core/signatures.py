"""What an installed callable accepts by keyword (docs/pitfalls.md#7), and a cache of that answer that
a new process can use without importing the library.

Reading a signature means importing its library, which for a transformers config class means torch
too (what that costs: docs/provenance.md, "Order and cost"). `accepted("module:qualname")` answers
from an entry under `cache_dir()` instead, as long as nothing the answer was read from has changed:

- key: the import path, the file Python would load for its module (found without importing it),
  the distribution's version, the Python version;
- entry: the answer, and every file it was read from with its size and mtime_ns (what Python checks
  before trusting a .pyc): the module the name is looked up in, the defining module of every class
  in the MRO and metaclass MRO, every layer of a decorated function, and this file, whose rules
  derive the names. A checksum covers the entry.

A hit costs a stat per file. Anything else is a miss: a changed file, another install or version,
an unreadable or altered entry. A miss imports the module, reads the live object and rewrites the
entry atomically. So an import path is answered for the files installed, not for an attribute
patched in this process; a callable passed as an object (a test's stand-in) is read live, never
cached.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional, Union

from align.core.caches import cache_home
from align.errors import ConfigError

CACHE_ENV = "ALIGN_SIGNATURE_CACHE"
"""Directory of the cache; default `signatures/` in align's cache directory (align.core.caches)."""


@dataclass
class Accepted:
    names: set[str]
    how: str
    """How the set was derived (reported when a check fails)."""
    name: str = ""
    """The callable's qualified name where it is defined (for messages)."""


def resolve(target: Union[str, Callable]) -> Any:
    """The object an import path "module:qualname" names (imported now), or `target` itself."""
    if callable(target):
        return target
    module, _, qual = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------------------- live inspection


def qualified_name(fn: Any) -> str:
    mod = getattr(fn, "__module__", "") or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{mod}.{qual}" if mod and not qual.startswith(mod) else qual


def _varkw(fn: Callable) -> Optional[str]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n, p in params.items() if p.kind == p.VAR_KEYWORD), None)


def kwargs_reads(fn: Callable, varkw: str) -> set[str]:
    """Names the installed source of `fn` reads out of its `**varkw` by literal: `kw.pop("x")`,
    `kw.get("x")`, `kw["x"]`, `"x" in kw`, `kw.setdefault("x")`."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return set()
    names: set[str] = set()

    def is_kw(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == varkw

    def lit(node: ast.AST) -> Optional[str]:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_kw(node.func.value):
            if node.func.attr in ("pop", "get", "setdefault") and node.args and (s := lit(node.args[0])):
                names.add(s)
        elif isinstance(node, ast.Subscript) and is_kw(node.value) and (s := lit(node.slice)):
            names.add(s)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            if is_kw(node.comparators[0]) and (s := lit(node.left)):
                names.add(s)
    return names


def inspect_accepted(fn: Callable) -> Accepted:
    """The keyword names the INSTALLED `fn` accepts, read from the live object.

    Explicit parameters from `inspect.signature`; a class's `attribute_map` aliases (transformers
    configs accept them); when `fn` takes **kwargs, the names its source reads out of them; and a
    class's `__post_init__(**kwargs)`, where transformers 5 config classes consume names their
    signature lacks (Gemma4TextConfig: global_head_dim).
    """
    sig = inspect.signature(fn)
    names = {n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    names.discard("self")
    how = "signature"
    amap = getattr(fn, "attribute_map", None) if inspect.isclass(fn) else None
    if isinstance(amap, dict):
        names |= set(amap)
        how += " + attribute_map"
    varkw = _varkw(fn)
    if varkw:
        names |= kwargs_reads(fn, varkw)
        how += f" + names read from **{varkw} in the installed source"
    post = getattr(fn, "__post_init__", None) if inspect.isclass(fn) else None
    if post is not None and (post_varkw := _varkw(post)):
        names |= kwargs_reads(post, post_varkw)
        how += f" + names its __post_init__ reads from **{post_varkw}"
    return Accepted(names, how, qualified_name(fn))


# ---------------------------------------------------------------------------------------- cache


def accepted(target: Union[str, Callable]) -> Accepted:
    """What the installed callable accepts: for an import path, from the cache when its entry is current."""
    if not isinstance(target, str):
        return inspect_accepted(target)
    key = _key(target)
    if key is None:  # not a file on disk (builtin, frozen, unusual package): nothing to key on
        return inspect_accepted(resolve(target))
    entry = cache_dir() / (hashlib.sha256(_canonical(key)).hexdigest()[:32] + ".json")
    hit = _read(entry, key)
    if hit is not None:
        return hit
    fn = resolve(target)
    acc = inspect_accepted(fn)
    module = target.partition(":")[0]
    # Write only what the files under the key say: Python loaded the file the key names, and the
    # object is that package's own (not a stand-in a test patched over it).
    if getattr(sys.modules.get(module), "__file__", None) == key["module_file"] and _top(fn) == _top(module):
        _write(entry, key, acc, {key["module_file"], __file__, *_sources(fn)})
    return acc


def _top(obj: Any) -> str:
    return (obj if isinstance(obj, str) else getattr(obj, "__module__", None) or "").split(".")[0]


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return cache_home()[0] / "signatures"


def _key(target: str) -> Optional[dict[str, Any]]:
    module = target.partition(":")[0]
    path = module_file(module)
    if path is None:
        return None
    return {"target": target, "module_file": path, "version": _version(module.split(".")[0]), "python": sys.version}


@lru_cache(maxsize=None)
def _version(top: str) -> Optional[str]:
    try:
        return importlib.metadata.version(top)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


_SUFFIXES = (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.SOURCE_SUFFIXES)


def module_file(module: str) -> Optional[str]:
    """The file `import module` would load, found without importing it or its parents
    (`importlib.util.find_spec("a.b")` imports `a`, and transformers' __init__ alone is slow to import).
    Only the top level goes through the import system; below it, the package directories are
    searched the way the path finder does: a package, then a module, then a namespace portion."""
    top, *parts = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not parts:
        return spec.origin if spec.has_location else None
    dirs = list(spec.submodule_search_locations or ())
    path = None
    for part in parts:
        if not dirs:  # the previous part was a module, not a package
            return None
        path, portions = None, []
        for d in dirs:
            base = os.path.join(d, part)
            if os.path.isfile(os.path.join(base, "__init__.py")):
                path, portions = os.path.join(base, "__init__.py"), [base]
                break
            path = next((base + s for s in _SUFFIXES if os.path.isfile(base + s)), None)
            if path:
                portions = []
                break
            if os.path.isdir(base):
                portions.append(base)
        dirs = portions
    return path


def _sources(fn: Any) -> set[str]:
    """The files whose text decides what `inspect_accepted(fn)` returns."""
    owner = getattr(fn, "__self__", None)  # a classmethod read off its class (MistralForCausalLM._from_config)
    classes = [c for o in (fn, owner) if inspect.isclass(o) for c in (*o.__mro__, *type(o).__mro__)]
    files = {getattr(sys.modules.get(c.__module__), "__file__", None) for c in classes}
    seen: set[int] = set()
    for f in [fn, *(vars(c).get(a) for c in classes for a in ("__init__", "__new__", "__call__", "__post_init__"))]:
        while f is not None and id(f) not in seen:  # each layer of a decorated function may live elsewhere
            seen.add(id(f))                         # (huggingface_hub's @strict wraps config __init__)
            f = getattr(f, "__func__", f)
            code = getattr(f, "__code__", None)
            files.add(code.co_filename if code else None)
            f = getattr(f, "__wrapped__", None)
    return {f for f in files if f and os.path.isfile(f)}


def _stat(path: str) -> Optional[list[int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _read(entry: Path, key: dict[str, Any]) -> Optional[Accepted]:
    """The cached answer, or None unless the entry is intact, for this key, and every file it was
    read from is unchanged. A damaged entry is never trusted, only replaced."""
    try:
        doc = json.loads(entry.read_text())
        body = doc["body"]
        if doc["sha256"] != hashlib.sha256(_canonical(body)).hexdigest() or body["key"] != key:
            return None
        if not body["deps"] or any(_stat(p) != st for p, st in body["deps"].items()):
            return None
        names = body["names"]
        if not all(isinstance(n, str) for n in names):
            return None
        return Accepted(set(names), str(body["how"]), str(body["name"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(entry: Path, key: dict[str, Any], acc: Accepted, files: set[str]) -> None:
    deps = {f: _stat(f) for f in sorted(files)}
    if None in deps.values():
        return
    body = {"key": key, "deps": deps, "name": acc.name, "names": sorted(acc.names), "how": acc.how}
    doc = {"sha256": hashlib.sha256(_canonical(body)).hexdigest(), "body": body}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".json")
    except OSError:
        return  # an unwritable cache costs the import next time, nothing else
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, entry)  # readers see the old entry or the new one, never half of one
    except OSError:
        Path(tmp).unlink(missing_ok=True)


# -------------------------------------------------------------------------- kwargs by name


@dataclass
class KwargsSite:
    """One library call align makes with kwargs built from config (docs/pitfalls.md#7)."""

    target: Union[str, Callable]
    """The installed callable, or its import path "module:qualname": read from align.core.signatures' cache,
    imported only on a miss. A site that names the path keeps `align.train`'s refusals import-free."""
    kwargs: dict[str, Any]
    """The kwargs exactly as the call site builds them (same builder function)."""
    key: str
    """Config key named in the error (what the user changes)."""
    also: tuple[Union[str, Callable], ...] = ()
    """Callables that receive this one's leftover **kwargs (their names are accepted too)."""
    exact: Optional[Callable[[], "KwargsSite"]] = None
    """Set when `kwargs` is the union over the devices the run may get (trainer.device=auto: deciding
    imports torch): builds the site for this machine's device, only when the union is refused."""


def accepted_names(fn: Union[str, Callable]) -> set[str]:
    return accepted(fn).names


def unknown_kwargs(site: KwargsSite) -> tuple[list[str], Accepted]:
    acc = accepted(site.target)
    for other in site.also:
        o = accepted(other)
        acc = Accepted(acc.names | o.names, f"{acc.how}; + {o.name} ({o.how})", acc.name)
    return sorted(set(site.kwargs) - acc.names), acc


def check_kwargs(fn: Union[str, Callable], kwargs: dict[str, Any], what: str, also: tuple = ()) -> None:
    """Fail by NAME when `fn`, as installed, does not accept a key of `kwargs` (docs/pitfalls.md#7)."""
    unknown, acc = unknown_kwargs(KwargsSite(fn, kwargs, what, also))
    if unknown:
        raise ConfigError(what, f"{acc.name} does not accept {unknown}; it accepts: {', '.join(sorted(acc.names))}")
