"""`python -m align.tools.annotate RUN_DIR "text" [--affects KEY,...]` (or `run_dir=RUN_DIR "text=..."
affects=KEY,...`): correct a run's record without editing it (docs/triage.md#8).

provenance.json is never touched. The correction is appended to PROVENANCE-NOTE.md beside it with
the manifest's sha256 (so a reader can tell the manifest is the one the note was written against),
the fields the correction affects, and every other field listed as REMAINING ACCURATE with its
value: a bare correction casts doubt over every field it does not mention.

The affected fields are the dotted manifest keys named with --affects plus any written in the text
(`git.commit`, `model.attn_implementation_resolved`; a group such as `git` covers its keys).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from align.errors import EXIT_CONFIG, EXIT_OK
from align.run.manifest import MANIFEST, _get, manifest_paths, now
from align.tools import keyed_argv

NOTE = "PROVENANCE-NOTE.md"


def _fmt(value: Any, limit: int = 100) -> str:
    if isinstance(value, dict):
        return f"({len(value)} entries)"
    if isinstance(value, list):
        return f"({len(value)} items)"
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def affected_keys(text: str, affects: Sequence[str], paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """(affected leaf paths, names in `affects` that are not manifest keys). The text contributes
    dotted keys (`git.commit`) and `backquoted` keys or groups; plain words never match."""
    groups = {p.split(".", 1)[0] for p in paths if "." in p}
    named = {a.strip() for a in affects if a.strip()}
    unknown = sorted(a for a in named if a not in paths and a not in groups)
    quoted = set(re.findall(r"`([A-Za-z0-9_.]+)`", text))
    dotted = {t.strip("`'\".,;:()[]") for t in text.split() if "." in t}
    chosen = named | {t for t in quoted | dotted if t in paths or t in groups}
    return [p for p in paths if p in chosen or p.split(".", 1)[0] in chosen & groups], unknown


def _parse(path: Path, raw: bytes) -> dict[str, Any]:
    """The manifest, or ConfigError (exit 2): a note must name the sha256 of a whole manifest."""
    from align.errors import ConfigError

    try:
        manifest = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        where = f"line {e.lineno} column {e.colno}" if hasattr(e, "lineno") else "its encoding"
        raise ConfigError(str(path), f"not a whole JSON document ({getattr(e, 'msg', e)} at {where}): a manifest "
                          "cut short (a kill during its write, a copy that stopped) cannot be annotated") from None
    if not isinstance(manifest, dict) or "schema_version" not in manifest:
        raise ConfigError(str(path), "not a provenance manifest (a JSON object with schema_version)")
    return manifest


def annotate(run_dir: Path, text: str, affects: Sequence[str] = ()) -> Path:
    manifest_path = Path(run_dir) / MANIFEST
    if not manifest_path.is_file():
        from align.errors import ConfigError

        raise ConfigError("RUN_DIR", f"no {MANIFEST} in {run_dir}: nothing to annotate")
    raw = manifest_path.read_bytes()
    manifest = _parse(manifest_path, raw)
    paths = [p for p in manifest_paths(manifest) if p != "null_reasons"]
    hit, unknown = affected_keys(text, affects, paths)
    if unknown:
        from align.errors import ConfigError

        groups = sorted({p.split(".", 1)[0] for p in paths if "." in p})
        raise ConfigError("--affects", f"not manifest keys: {unknown}; use dotted keys such as git.commit, "
                                       f"or a group: {', '.join(groups)}")
    accurate = [p for p in paths if p not in hit]
    reasons = manifest.get("null_reasons", {})
    lines = [
        f"## Correction, {now()}",
        "",
        f"Annotates `{MANIFEST}` sha256 `{hashlib.sha256(raw).hexdigest()}` (status `{manifest.get('status')}`, "
        f"schema v{manifest.get('schema_version')}); the manifest itself is unchanged.",
        "",
        text.strip(),
        "",
        "### Affected by this correction",
        "",
        *([f"- `{p}` (recorded: {_fmt(_get(manifest, p))})" for p in hit]
          or ["- none named: the correction concerns no recorded field"]),
        "",
        "### Remains accurate",
        "",
        *[f"- `{p}`: {_fmt(_get(manifest, p))}"
          + (f" (null: {reasons[p]})" if p in reasons and _get(manifest, p) is None else "")
          for p in accurate],
        "",
    ]
    note = Path(run_dir) / NOTE
    with note.open("a") as f:
        if note.stat().st_size == 0:
            f.write(f"# Provenance notes for {Path(run_dir).resolve().name}\n\n"
                    f"Corrections to `{MANIFEST}`, which is never edited. Newest last.\n\n")
        f.write("\n".join(lines) + "\n")
    return note


def main(argv: Sequence[str] | None = None) -> int:
    from align.errors import AlignError
    from align.run.cli import die

    p = argparse.ArgumentParser(prog="python -m align.tools.annotate", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("text")
    p.add_argument("--affects", default="", help="comma-separated dotted manifest keys the correction concerns")
    args = p.parse_args(keyed_argv(sys.argv[1:] if argv is None else argv, ("run_dir", "text"), ("affects",)))
    try:
        note = annotate(args.run_dir, args.text, args.affects.split(","))
    except AlignError as e:
        die(str(e), EXIT_CONFIG)
    print(f"appended a correction to {note} ({MANIFEST} untouched)")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

