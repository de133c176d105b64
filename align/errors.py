"""Exit codes and the errors that map onto them. Exit codes are part of the interface
(docs/architecture.md#exit-codes)."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_CONFIG = 2  # configuration or preflight refused, before any heavy work
EXIT_NONFINITE = 81  # non-finite halt (HALT.json beside the manifest)
EXIT_SIGNAL = 143  # coordinated stop on a signal; resumable


class AlignError(Exception):
    """Base for errors align turns into a one-line message and an exit code."""

    exit_code = 1


class ConfigError(AlignError):
    """Bad configuration or input: exit 2 with one line naming the key/path and what is accepted."""

    exit_code = EXIT_CONFIG

    def __init__(self, key: str, message: str, value: Any = None) -> None:
        self.key = key
        self.message = message
        self.value = value
        from align.core.redaction import is_secret

        # A credential-named key never echoes its value (it would land in logs).
        got = "" if value is None or is_secret(key, value) else f" (got {value!r})"
        super().__init__(f"{key}: {message}{got}")


class NonFiniteHalt(AlignError):
    exit_code = EXIT_NONFINITE


class StopRequested(AlignError):
    """A stop signal before the first optimizer step: nothing to finish or save, the run ends at once (143)."""

    exit_code = EXIT_SIGNAL
