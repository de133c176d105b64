"""eval.json (what the eval resolved to and what it measured) and eval.md (the same as a table).

eval.json is written when the eval starts with every key of `SCHEMA` present, null where not known
yet, and completed on the way out whatever the exit code. Every null leaf carries a reason in
`null_reasons` (a dotted path -> why): present-and-null is a statement, an absent key an accident.
The engine's own description (`arms.<arm>.engine`) and the resolved config are recorded as given.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from align.core.provenance import now

SCHEMA_VERSION = 1
REPORT_JSON = "eval.json"
REPORT_MD = "eval.md"
PENDING = "pending: not known yet when this was written"

SCHEMA: dict[str, Any] = {
    "schema_version": "integer version of this layout",
    "status": "started, then complete",
    "run": {"name": "", "run_dir": "", "argv": "command line (secret-named overrides redacted)",
            "hydra_overrides": "", "host": "", "pid": "", "start_time": "UTC ISO", "end_time": "UTC ISO",
            "exit_code": "0 done, 2 refused (docs/architecture.md)", "exit_reason": "one line"},
    "config": {"hash": "sha256 of the canonical JSON of the resolved config", "resolved": "the resolved config"},
    "git": {"root": "", "commit": "", "describe": "", "branch": "", "dirty": "", "diff_sha256": "", "allow_dirty": ""},
    "versions": "installed versions (align.core.provenance.versions)",
    "device": "the device generated on (type, name, capability, count)",
    "eval": {"task": "", "oracle": "", "oracle_shuffle": "", "samples": "n per prompt", "limit": ""},
    "dataset": {"path": "", "bundled": "the GSM8K copy shipped in the package", "sha256": "file content",
                "records": "records evaluated (after limit)", "fields": "the fields read", "template": "user message"},
    "scorer": {"kind": "verifier or classifier", "identity": "name, version (what the cache key holds)"},
    "generation": {"spec": "the SamplingSpec of every call (seed: the base of each call's seed)",
                   "engine_config": "the EngineConfig requested", "prompts_per_call": ""},
    "arms": "{arm: {model, engine, cache, metrics, timing, samples_file}}; arm `model` is model_dir, "
            "`compare_to` the second model, `oracle` the references",
    "discriminator": "refusal with two arms: what the deflection column says (align/evaluation/refusal.py)",
    "null_reasons": "{dotted path: why it is null}",
}

# Recorded as given by their producers (their nulls are theirs to explain).
_OPAQUE = re.compile(r"^(config\.resolved|null_reasons|arms\.[^.]+\.engine)(\.|$)")


def skeleton() -> dict[str, Any]:
    def empty(schema: Mapping[str, Any]) -> dict[str, Any]:
        return {k: empty(v) if isinstance(v, dict) else None for k, v in schema.items()}

    data = empty(SCHEMA)
    data["schema_version"] = SCHEMA_VERSION
    data["null_reasons"] = {p: PENDING for p, _ in _leaves(data) if p not in ("schema_version", "null_reasons")}
    return data


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict) and obj and not _OPAQUE.match(prefix):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, obj


def missing_reasons(data: Mapping[str, Any]) -> list[str]:
    """Null leaves without a reason (must be none)."""
    return [p for p, v in _leaves(dict(data)) if v is None and p not in data["null_reasons"]]


class EvalRecord:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / REPORT_JSON
        self.data = skeleton()

    def set(self, path: str, value: Any, reasons: Optional[Mapping[str, str]] = None) -> None:
        """Set `path` (a dict value is a subtree); `reasons` name why its null leaves are null,
        relative to `path` ("" for `path` itself)."""
        parts = path.split(".")
        cur, nulls = self.data, self.data["null_reasons"]
        for i, part in enumerate(parts[:-1]):
            if not isinstance(cur.get(part), dict):  # a null group gets its first member
                cur[part] = {}
                nulls.pop(".".join(parts[:i + 1]), None)
            cur = cur[part]
        cur[parts[-1]] = value
        for p in [p for p in nulls if p == path or p.startswith(path + ".")]:
            del nulls[p]
        for rel, why in (reasons or {}).items():
            nulls[f"{path}.{rel}" if rel else path] = why

    def null(self, path: str, reason: str) -> None:
        self.set(path, None, {"": reason})

    def write(self, status: str) -> None:
        self.data["status"] = status
        self.data["null_reasons"].pop("status", None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)

    def complete(self, exit_code: int, reason: str) -> None:
        self.set("run.end_time", now())
        self.set("run.exit_code", int(exit_code))
        self.set("run.exit_reason", reason)
        for path, why in list(self.data["null_reasons"].items()):
            if why.startswith("pending"):
                self.data["null_reasons"][path] = f"not reached: the eval ended (exit {exit_code}) before this"
        self.write("complete")


# ----------------------------------------------------------------------------------------- markdown


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    return "" if v is None else str(v)


def markdown(data: Mapping[str, Any]) -> str:
    """The report as a table: one row per metric, one column per arm."""
    arms = data.get("arms") or {}
    ds, scorer, gen = data["dataset"], data["scorer"], data["generation"]
    lines = [f"# eval: {data['eval']['task']}", "",
             f"- dataset: `{ds['path']}` (sha256 {str(ds['sha256'])[:12]}, {ds['records']} records)",
             f"- scorer: {scorer['kind']} {json.dumps(scorer['identity'])}",
             f"- generation: {json.dumps(gen['spec']) if gen['spec'] else 'none (oracle)'}", ""]
    for name, arm in arms.items():
        model = arm.get("model") or {}
        cache = arm.get("cache") or {}
        if not model:
            lines.append(f"- `{name}`: the references scored as completions ({arm['timing'].get('oracle_pairing')})")
            continue
        lines.append(f"- `{name}`: {model['path']} ({model['kind']}, weights sha256 {model['weights_sha256'][:12]}); "
                     f"cache hit: {cache.get('hit')}")
    names = list(arms)
    metrics: list[str] = []
    for arm in arms.values():
        metrics += [m for m in (arm.get("metrics") or {}) if m not in metrics]
    lines += ["", "| metric | " + " | ".join(f"`{n}`" for n in names) + " |",
              "| --- |" + " --- |" * len(names)]
    for m in metrics:
        lines.append(f"| {m} | " + " | ".join(_fmt((arms[n].get("metrics") or {}).get(m)) for n in names) + " |")
    disc = data.get("discriminator")
    if isinstance(disc, dict):
        lines += ["", f"Discriminator: **{disc['verdict']}**: {disc['reason']}"]
    return "\n".join(lines) + "\n"
