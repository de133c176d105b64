"""Content hashes a record names: files, file sets, tokenizers and configs, by what they hold. Imports
neither torch nor transformers: preflight hashes before anything heavy is loaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Optional


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def sha256_files(paths: list[Path], base: Path) -> str:
    """One digest over several files: each file's name relative to `base` and its content."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(base)).encode() + b"\0" + bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(resolved: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(resolved).encode()).hexdigest()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")


def tokenizer_hashes(tok_dir: Path) -> tuple[Optional[str], Optional[str], dict[str, str]]:
    """(tokenizer sha256, chat template sha256, {file: sha256}) from the files on disk, without
    loading the tokenizer. The template is the `.jinja` file, else tokenizer_config's field."""
    files = [tok_dir / n for n in TOKENIZER_FILES if (tok_dir / n).is_file()]
    if not files:
        return None, None, {}
    template: Optional[str] = None
    if (tok_dir / "chat_template.jinja").is_file():
        template = (tok_dir / "chat_template.jinja").read_text()
    elif (tok_dir / "tokenizer_config.json").is_file():
        t = json.loads((tok_dir / "tokenizer_config.json").read_text()).get("chat_template")
        template = t if isinstance(t, str) else (canonical_json(t) if t else None)
    tsha = hashlib.sha256(template.encode()).hexdigest() if template else None
    return sha256_files(files, tok_dir), tsha, {str(p): sha256_file(p) for p in files}
