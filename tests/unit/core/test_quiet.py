"""align.core.quiet: each filter drops the one third-party record it names and lets every other record
of its logger through; transformers' progress bars show on a terminal only."""

from __future__ import annotations

import enum
import io
import logging

import pytest

from align.core import quiet

SO = "/venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
PYTREE_MSG = ("%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type. "
              "Calling register_constant() on Enum subclasses is deprecated and will be an error in a future release.")


class Mine(enum.Enum):
    a = 1


class Theirs(enum.Enum):
    a = 1


Theirs.__module__ = "torchao.quantization.quantize_.common.kernel_preference"


def _record(name: str, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, None)


def _passes(record: logging.LogRecord) -> bool:
    return logging.getLogger(record.name).filter(record)


@pytest.mark.parametrize("record,dropped", [
    (_record("torchao", f"Failed to load {SO}: Could not load this library: {SO}"), True),
    (_record("torchao", "Skipping import of cpp extensions due to incompatible torch version."), False),
    (_record("torchao.kernel.intmm", "Warning: Detected no triton, on systems without Triton certain kernels will "
                                     "not work"), True),
    (_record("torchao.kernel.intmm", "int_mm is slow on this device"), False),
    (_record("torch.utils._pytree", PYTREE_MSG, Theirs), True),
    (_record("torch.utils._pytree", PYTREE_MSG, Mine), False),  # another library's Enum: still said
    (_record("torch.utils._pytree", "some other pytree warning %s", Theirs), False),
    (_record("matplotlib.font_manager", "generated new fontManager"), True),
    (_record("matplotlib.font_manager", "findfont: Font family 'x' not found."), False),
], ids=["torchao-so", "torchao-other", "no-triton", "intmm-other", "torchao-enum", "other-enum", "pytree-other",
        "font-cache", "font-other"])
def test_each_filter_drops_exactly_its_record(record, dropped):
    quiet.install()
    quiet.install()  # idempotent: one filter per logger
    assert [type(f) for f in logging.getLogger(record.name).filters].count(quiet._Drop) == 1
    assert _passes(record) is not dropped


@pytest.mark.parametrize("tty", [False, True])
def test_transformers_progress_bars_show_on_a_terminal_only_and_are_restored(monkeypatch, tty):
    from transformers.utils import logging as hf_logging

    stderr = io.StringIO()
    stderr.isatty = lambda: tty
    monkeypatch.setattr("sys.stderr", stderr)
    assert hf_logging.is_progress_bar_enabled()
    with quiet.library_progress_bars():
        assert hf_logging.is_progress_bar_enabled() is tty
    assert hf_logging.is_progress_bar_enabled()
