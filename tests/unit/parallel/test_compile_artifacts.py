"""trainer.compile_artifacts (align/parallel/compile_artifacts.py): what one process compiled, saved
to a file, is a cache hit in a fresh process with an empty inductor cache; a file that is not
artifacts, or a path that is not a file, is refused naming the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from align.errors import ConfigError
from align.parallel import compile_artifacts

ROOT = Path(__file__).resolve().parents[3]

# One small compiled forward and backward on the CPU, between load and save as a run does them.
SCRIPT = """
import json, sys, torch
from torch._dynamo.utils import counters
from align.parallel import compile_artifacts as ca
record = ca.load(sys.argv[1])
f = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w).sum(), dynamic=True)
f(torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)).backward()
print(json.dumps({"record": ca.save(record), "cache": dict(counters["inductor"])}))
"""


def _run(path: Path, cache_dir: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_artifacts_one_process_saved_are_cache_hits_in_a_fresh_process(tmp_path):
    path = tmp_path / "artifacts.bin"
    first = _run(path, tmp_path / "cache1")
    assert first["record"]["loaded"] is None and "no file yet" in first["record"]["loaded_why"]
    assert first["cache"].get("fxgraph_cache_miss", 0) >= 1 and not first["cache"].get("fxgraph_cache_hit")
    saved = first["record"]["saved"]
    assert saved["bytes"] == path.stat().st_size > 0 and saved["artifacts"]["inductor"] >= 1
    second = _run(path, tmp_path / "cache2")  # an empty on-disk cache: only the file can serve it
    assert second["record"]["loaded"] == {"bytes": saved["bytes"], "artifacts": saved["artifacts"]}
    assert second["cache"].get("fxgraph_cache_hit", 0) >= 1 and not second["cache"].get("fxgraph_cache_miss")


def test_a_file_that_is_not_artifacts_or_a_path_that_is_not_a_file_is_refused(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not artifacts")
    with pytest.raises(ConfigError, match="trainer.compile_artifacts.*not torch.compiler cache artifacts"):
        compile_artifacts.load(str(junk))
    with pytest.raises(ConfigError, match="trainer.compile_artifacts.*must name a file"):
        compile_artifacts.load(str(tmp_path))
    assert compile_artifacts.load(None) is None and compile_artifacts.save(None) is None
