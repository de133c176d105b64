"""Write the bundled preference set align/data/assets/gsm8k_pairs/gsm8k_pairs.jsonl from the bundled
GSM8K train split, deterministically (same input, same seed: the same bytes).

    python scripts/make_gsm8k_pairs.py            # rewrites the file; `git diff` must then be empty

Each pair: prompt = the question, chosen = the reference solution, rejected = the same solution with
its final "#### N" and the last occurrence of N before it changed to another number M (seeded per
record). The two sides differ only in the answer tokens, so a model that learns to prefer chosen has
learned which answer the reasoning supports. Records whose final answer is not a plain non-negative
integer, or whose N does not appear in the reasoning, are skipped (the change would be the final line
alone). `steps` (the reasoning lines) is kept as the diversity root, as for bundled GSM8K.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "align" / "data" / "assets" / "gsm8k" / "train.jsonl"
OUT = REPO / "align" / "data" / "assets" / "gsm8k_pairs" / "gsm8k_pairs.jsonl"
SEED = 20261201
PAIRS = 2000

FINAL = re.compile(r"\n#### (\d+)\s*\Z")


def number_at(text: str, n: str) -> list[re.Match]:
    """Occurrences of the number n as a whole number (not digits of 124, 1.24 or 1,240)."""
    return list(re.finditer(rf"(?<![\d.,]){re.escape(n)}(?!\d|[.,]\d)", text))


def altered(n: int, rng: np.random.Generator) -> int:
    """A different non-negative integer near n (an answer off by a plausible slip)."""
    delta = int(rng.integers(1, 11))
    return n - delta if rng.random() < 0.5 and n - delta >= 0 else n + delta


def make_pair(row: dict, index: int, seed: int) -> Optional[dict]:
    answer = row["answer"]
    final = FINAL.search(answer)
    if final is None:
        return None
    n = final.group(1)
    body = answer[: final.start()]
    hits = number_at(body, n)
    if not hits:
        return None
    m = str(altered(int(n), np.random.default_rng([seed, index])))
    last = hits[-1]
    rejected = body[: last.start()] + m + body[last.end():] + f"\n#### {m}"
    steps = sum(1 for ln in answer.splitlines() if ln.strip() and not ln.startswith("####"))
    return {"prompt": row["question"], "chosen": answer, "rejected": rejected, "steps": steps}


def build(src: Path, pairs: int, seed: int) -> list[dict]:
    out = []
    with src.open() as f:
        for index, line in enumerate(f):
            pair = make_pair(json.loads(line), index, seed)
            if pair is not None:
                out.append(pair)
                if len(out) == pairs:
                    break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=PAIRS)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = build(SRC, args.pairs, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} pairs to {args.out}")


if __name__ == "__main__":
    main()
