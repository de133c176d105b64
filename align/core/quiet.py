"""Third-party log records that say nothing about a run, dropped at the logger that emits them; and
transformers' progress bars kept to a terminal.

transformers imports torchao whenever it is installed (`transformers.modeling_utils` imports its
quantizers, and the torchao quantizer imports torchao), so every command that touches a model imports
it, 8-bit optimizer or not. On import torchao logs a warning for each optional compiled kernel library
its wheel ships that does not load on this machine (one built for another Python or GPU
architecture), another when triton is absent (torch's CPU builds come without it), and registers its
Enum classes as pytree constants, which torch now logs as deprecated. Not importing cannot avoid
these, and none of the calls is align's to change: each record is dropped by a filter on its own
logger that matches only that record; every other record of those loggers passes (docs/pitfalls.md#25).
matplotlib (the loss plot) says at INFO, the first time a machine imports it, that it built its font
cache: a line in the run's closing summary that says nothing about the run.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Callable, Iterator


def _kernel_library(record: logging.LogRecord) -> bool:
    """torchao's package init: `logger.warning(f"Failed to load {file}: {e}")` for one of its `_C*.so`."""
    msg = record.getMessage()
    return msg.startswith("Failed to load ") and "torchao" in msg and "/_C" in msg


def _no_triton(record: logging.LogRecord) -> bool:
    """torchao's int-matmul kernels on import without triton."""
    return record.getMessage().startswith("Warning: Detected no triton")


def _enum_constant(record: logging.LogRecord) -> bool:
    """`torch.utils._pytree`: "%s is an Enum subclass ... Calling register_constant() on Enum subclasses
    is deprecated", for an Enum of torchao's (its `register_as_pytree_constant`)."""
    if not (isinstance(record.msg, str) and record.msg.startswith("%s is an Enum subclass")):
        return False
    cls = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return str(getattr(cls, "__module__", "")).startswith("torchao")


def _font_cache(record: logging.LogRecord) -> bool:
    """matplotlib's first import on a machine: `_log.info("generated new fontManager")`."""
    return record.getMessage() == "generated new fontManager"


DROPPED: dict[str, Callable[[logging.LogRecord], bool]] = {
    "torchao": _kernel_library,
    "torchao.kernel.intmm": _no_triton,
    "torch.utils._pytree": _enum_constant,
    "matplotlib.font_manager": _font_cache,
}
"""Logger name -> the records of that logger to drop."""


class _Drop(logging.Filter):
    def __init__(self, match: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.match = match

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.match(record)


def install() -> None:
    """Idempotent, and imports nothing: a logger named before torch or torchao asks for it is the one
    they get."""
    for name, match in DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.match is match for f in logger.filters):
            logger.addFilter(_Drop(match))


@contextlib.contextmanager
def library_progress_bars() -> Iterator[None]:
    """transformers' own progress bars (writing shards, loading weights) follow align's rule for its
    own (align/telemetry/progress.py): a bar on a terminal, nothing in a log file or a pipe."""
    from transformers.utils import logging as hf_logging

    hide = hf_logging.is_progress_bar_enabled() and not sys.stderr.isatty()
    if hide:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            hf_logging.enable_progress_bar()
