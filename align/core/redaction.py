"""Redaction: credentials never reach the manifest, logs, the run dir's `.hydra/` or W&B.

A value is a credential when its NAME is a credential's name or when the value has a credential's
SHAPE. Names are compared as whole words after folding case and camelCase (`apiKey` is `api_key`):
exactly `password`, `secret`, `api_key`, `token`, `hf_token`, `wandb_api_key`, ... (`CREDENTIAL_NAMES`),
or ending in `_password`, `_secret`, `_api_key`, `_token`, ... (`CREDENTIAL_SUFFIXES`: `db_password`,
`HF_TOKEN`, `GITHUB_TOKEN`). A word merely containing KEY or TOKEN is configuration (`data.tokens_field`,
`sampler.max_tokens`, `cache_key`): redacting it would make the recorded config unable to replay the
run. A `*_token` that holds an integer id or a bracketed marker (`pad_token: "<pad>"`) is a tokenizer
setting, one holding a float a rate per token (`flops_per_token`): neither is a credential. Shapes
(`CREDENTIAL_SHAPES`) catch a key under any name: `hf_...`, `sk-...`, GitHub, Slack and AWS key ids,
JWTs, and W&B's 40-hex API keys (a 40-hex value under a name that says sha/commit/revision/hash is a
digest, and kept).

One rule, applied where each value is written: `redact` (a mapping or list, names collected) for the
manifest (`redact_record` in `Manifest.write`), `.hydra/` (and a sweep's multirun.yaml), the W&B init
kwargs (name, project, tags, config), summary and rows; `redact_value` for
one named value (the run name in a plot title); `RedactingFilter` on every log handler (train.log,
rank<r>/train.log, the console W&B captures into output.log), which replaces each credential shape in a
line. What the run writes besides (history rows, exit records, HALT.json, checkpoint metadata) holds
numbers, step counts, parameter names and paths under the run dir, whose own path is refused at the door
when it has a credential's shape (align.run.run_dir).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Mapping

REDACTED = "<redacted>"

CREDENTIAL_NAMES = frozenset({
    "password", "passwd", "secret", "api_key", "apikey", "token", "access_token", "auth_token", "api_token",
    "bearer_token", "refresh_token", "hf_token", "wandb_api_key", "client_secret", "secret_key", "private_key",
    "access_key", "secret_access_key",
})
CREDENTIAL_SUFFIXES = ("_password", "_passwd", "_secret", "_api_key", "_apikey", "_secret_key", "_private_key",
                       "_access_key", "_token")
CREDENTIAL_SHAPES = re.compile("|".join((
    r"\bhf_[A-Za-z0-9]{30,}",                      # Hugging Face
    r"\bsk-[A-Za-z0-9_-]{20,}",                    # OpenAI / Anthropic style secret keys
    r"\bgh[pousr]_[A-Za-z0-9]{36,}|\bgithub_pat_[A-Za-z0-9_]{22,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",             # Slack
    r"\bAKIA[0-9A-Z]{16}\b",                       # AWS access key id
    r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]+",  # JWT: base64 '{"' header and payload
)))
_WANDB_KEY = re.compile(r"(local-)?[0-9a-f]{40}")
_DIGEST_NAME = re.compile(r"sha|commit|revision|hash|digest|fingerprint", re.IGNORECASE)
_MARKER = re.compile(r"<[^<>\s]{1,30}>|\[[^\[\]\s]{1,30}\]")


def _words(name: str) -> str:
    """`wandbApiKey` / `WANDB-API-KEY` / `wandb_api_key` -> `wandb_api_key`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name)).replace("-", "_").lower()


def _is_number_like(value: Any) -> bool:
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if value is None or number(value):
        return True
    return isinstance(value, (list, tuple)) and all(number(v) for v in value)


def secret_name(leaf: str, value: Any = None) -> bool:
    """Whether `leaf` (the last part of a dotted name) names a credential, given what it holds."""
    w = _words(leaf)
    if w in CREDENTIAL_NAMES:
        return True
    if not w.endswith(CREDENTIAL_SUFFIXES):
        return False
    if w.endswith("_token") and (_is_number_like(value) or (isinstance(value, str) and _MARKER.fullmatch(value))):
        return False  # a tokenizer's special token or its id, a count per token (`flops_per_token`)
    return True


def secret_shape(value: Any, leaf: str = "") -> bool:
    """Whether a string value looks like a credential whatever its name."""
    if not isinstance(value, str):
        return False
    if CREDENTIAL_SHAPES.search(value):
        return True
    return bool(_WANDB_KEY.fullmatch(value)) and not _DIGEST_NAME.search(leaf)


def is_secret(name: str, value: Any = None) -> bool:
    """Whether a value stored under `name` must be redacted (a numeric password is still a password)."""
    leaf = str(name).rsplit(".", 1)[-1]
    return secret_name(leaf, value) or secret_shape(value, leaf)


def redact_value(name: str, value: Any) -> Any:
    """`value` as it may be written under `name`: REDACTED when `is_secret(name, value)`."""
    return REDACTED if is_secret(name, value) else value


def redact(obj: Any, path: str = "", found: list[str] | None = None) -> Any:
    """A copy of a nested dict/list with every secret value replaced (by its key's name or by its shape;
    a list's string by its shape); `found` collects the dotted names that were redacted (names only,
    never values)."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            key = f"{path}.{k}" if path else str(k)
            if is_secret(str(k), v):
                out[k] = REDACTED
                if found is not None:
                    found.append(key)
            else:
                out[k] = redact(v, key, found)
        return out
    if isinstance(obj, (list, tuple)):
        out_list = []
        for i, v in enumerate(obj):
            if secret_shape(v):  # `logger.tags: [hf_...]`: an element has no name of its own
                out_list.append(REDACTED)
                if found is not None:
                    found.append(f"{path}[{i}]")
            else:
                out_list.append(redact(v, f"{path}[{i}]", found))
        return type(obj)(out_list)
    return obj


def redact_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as written (the manifest): `redact`ed, the names it redacted added to its `redacted` list."""
    found: list[str] = []
    out = redact(record, found=found)
    out["redacted"] = list(dict.fromkeys([*(record.get("redacted") or []), *found]))
    return out


def redact_text(text: str) -> str:
    """Free text (a log line) with every credential shape in it replaced. A bare 40-hex W&B key is not
    among them: in a line nothing names it, and a commit or a digest has the same shape."""
    return CREDENTIAL_SHAPES.sub(REDACTED, text)


class RedactingFilter(logging.Filter):
    """On a log handler: the record's line with every credential shape replaced (`redact_text`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        line = record.getMessage()
        clean = redact_text(line)
        if clean != line:
            record.msg, record.args = clean, ()
        return True


def redact_logs(logger: logging.Logger | None = None) -> None:
    """Put `RedactingFilter` on every handler of `logger` (the root logger by default), once each."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def redact_override(override: str) -> str:
    """`a.b.api_key=xyz` -> `a.b.api_key=<redacted>`; Hydra overrides are `[+~]key=value` strings."""
    key, sep, value = override.partition("=")
    if sep and is_secret(key.lstrip("+~"), _parse_scalar(value)):
        return f"{key}={REDACTED}"
    return REDACTED if not sep and secret_shape(override) else override


def _parse_scalar(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def redact_argv(argv: list[str]) -> list[str]:
    return [redact_override(a) for a in argv]


# Environment variables worth recording: they change what runs (devices, threads, comms, caches).
ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "HF_", "TRANSFORMERS_", "WANDB_",
                "ALIGN_", "SLURM_", "MASTER_", "TORCHELASTIC_")
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TOKENIZERS_PARALLELISM")


def recorded_env(environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment variables that belong in the manifest (credentials redacted), and the names
    that were redacted."""
    environ = os.environ if environ is None else environ
    found: list[str] = []
    env: dict[str, str] = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            if is_secret(name, environ[name]):
                env[name] = REDACTED
                found.append(name)
            else:
                env[name] = environ[name]
    return env, found
