"""A plain SFT run prints align's own lines and nothing of its libraries': no import-time warnings of
torchao (imported by transformers whenever installed), no progress bar of transformers' in a log, and
peft and bitsandbytes are not imported at all without LoRA or 8-bit (docs/pitfalls.md#25)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

# align.train in a child that reports, at exit, which of the optional libraries were ever imported.
PROBE = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: sys.stdout.write('IMPORTED=%s\\n' % ','.join(\n"
    "    m for m in ('peft', 'bitsandbytes') if m in sys.modules)))\n"
    "sys.argv = ['align.train'] + sys.argv[1:]\n"
    "runpy.run_module('align.train', run_name='__main__')\n"
)

# A plain CPU run prints nothing on stderr: align's lines, progress included (align/telemetry/progress.py),
# go through its logger. stdout: Hydra's console handler, align's logger only; and the probe's report.
STDERR_ALLOWED: list[re.Pattern] = []
PROGRESS = re.compile(r"step \d+/\d+ loss [\d.]+ tok/s [\d,]+ eta [\d,]+s( compile \d+% of the wall)?")
STDOUT_ALLOWED = [re.compile(r"\[[\d\- :,]+\]\[align\]\[(INFO|WARNING)\] - .*"), re.compile(r"IMPORTED=.*")]


def _unexpected(text: str, allowed: list[re.Pattern]) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not any(p.fullmatch(ln) for p in allowed)]


def test_a_plain_sft_run_prints_only_its_own_lines_and_imports_no_peft(tmp_path):
    p = subprocess.run([sys.executable, "-c", PROBE, "logger=none", "trainer.max_steps=2", "allow_dirty=true",
                        f"hydra.run.dir={tmp_path / 'run'}", "data.max_records=200"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _unexpected(p.stderr, STDERR_ALLOWED) == []
    assert _unexpected(p.stdout, STDOUT_ALLOWED) == []
    for text in (p.stdout, (tmp_path / "run" / "train.log").read_text()):  # the progress line, in both
        assert any(PROGRESS.fullmatch(ln.split(" - ", 1)[-1]) for ln in text.splitlines()), text
    assert "IMPORTED=\n" in p.stdout, p.stdout  # neither peft nor bitsandbytes
    assert (tmp_path / "run" / "export" / "config.json").is_file()  # the export ran (its bar would be here)
