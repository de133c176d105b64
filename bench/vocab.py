"""Large vocabularies: Gemma-4's 262,144-entry LM head, full-logits cross-entropy against align's
chunked CE (`trainer.loss_chunk_tokens`), same model, data and micro-batches, one GPU. Prints peak
memory and real tokens/s of each.

    python bench/vocab.py [--steps 8] [--tiny]      # results under $OUT/vocab (default outputs/bench)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import bimodal_lengths, token_rows, write_rows  # noqa: E402

ARMS = {"full_logits": ["trainer.loss_chunk_tokens=0"], "chunked_2048": ["trainer.loss_chunk_tokens=2048"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    out = Path(os.environ.get("OUT", "outputs/bench")).resolve() / "vocab"
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "rows.jsonl"
    write_rows(rows_file, token_rows(bimodal_lengths(1000), 32000))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    results = {}
    for arm, extra in ARMS.items():
        run_dir = out / "runs" / arm
        cmd = [sys.executable, "-m", "align.train", "model=gemma4", f"model.preset={'tiny' if a.tiny else 'small'}",
               "+model.overrides.vocab_size=262144",
               *(["+model.overrides.vocab_size_per_layer_input=262144"] if a.tiny else []), "model.dtype=bfloat16", "data=tokens", f"data.path={rows_file}",
               "data.max_seq_len=4096", f"data.cache_dir={out / 'cache'}", "sampler=budget", "sampler.bucket_size=100000",
               f"sampler.max_tokens={a.max_tokens}", "sampler.pad_to_multiple_of=8", "sampler.mask_padding=false",
               "logger=none", "trainer.export=false", f"trainer.max_steps={a.steps}", "optimizer.warmup_ratio=0",
               "allow_dirty=true", "model.allow_over_memory=true", *extra, f"hydra.run.dir={run_dir}"]
        with (out / f"{arm}.log").open("w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        if rc:
            results[arm] = {"error": f"exit {rc}: {(out / f'{arm}.log').read_text().strip().splitlines()[-1][:300]}"}
            continue
        rows = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
        m = rows[2:]
        sec = m[-1]["elapsed_s"] - rows[1]["elapsed_s"]
        results[arm] = {"peak_mem_gib": max(r["mem_peak_gib"] or 0 for r in rows),
                        "real_tokens_per_s": sum(r["real_tokens"] for r in m) / sec,
                        "tokens_per_micro_batch": sum(r["tokens"] for r in m) / len(m), "last_loss": rows[-1]["loss"]}
    (out / "vocab.json").write_text(json.dumps(results, indent=1))
    for arm, r in results.items():
        print(arm, json.dumps(r))


if __name__ == "__main__":
    main()
