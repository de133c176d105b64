"""The DPO bench's data, built deterministically from the bundled GSM8K train split (no seed: the
same package, the same bytes).

Pair i: prompt = questions 3i, 3i+1, 3i+2 (one user turn, separated by blank lines), chosen = their
three reference solutions, rejected = the three solutions of the triple half the split away
(triple (i + T // 2) mod T of T). Rendered through the bundled tokenizer's chat template, a pair is
about a thousand tokens as a trainer forwards it (prompt + chosen, then prompt + rejected);
`python bench/pairs.py` prints the mean.

    pairs.jsonl       {"prompt", "chosen", "rejected"}: `data=preference` (align) and TRL's DPOTrainer
    pair_rows.jsonl   {"input_ids", "loss_mask"}: the 2 sequences of every pair exactly as align's
                      preference encoder builds them (loss on the completion and its EOS), for an
                      SFT arm on the very rows a DPO arm forwards (`data=tokens`)

    python bench/pairs.py --pairs 1024 --out outputs/bench     # writes both, prints the token counts
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GSM8K_TRAIN = ROOT / "align" / "data" / "assets" / "gsm8k" / "train.jsonl"
PER_SIDE = 3
"""Questions (and solutions) per pair."""
SEPARATOR = "\n\n"
PAIRS_FILE, PAIR_ROWS_FILE = "pairs.jsonl", "pair_rows.jsonl"


def gsm8k_triples() -> list[list[dict]]:
    rows = [json.loads(line) for line in GSM8K_TRAIN.read_text().splitlines() if line.strip()]
    return [rows[k:k + PER_SIDE] for k in range(0, len(rows) - PER_SIDE + 1, PER_SIDE)]


def check_count(n: int, triples: int) -> None:
    if not 1 <= n <= triples:
        raise ValueError(f"--pairs {n}: accepted 1..{triples} (GSM8K train holds {triples} triples)")


def build_pairs(n: int) -> list[dict[str, str]]:
    """The first `n` bench pairs (module doc); ValueError beyond the split's triples."""
    triples = gsm8k_triples()
    check_count(n, len(triples))
    shift = len(triples) // 2
    out = []
    for i in range(n):
        own, other = triples[i], triples[(i + shift) % len(triples)]
        out.append({"prompt": SEPARATOR.join(r["question"] for r in own),
                    "chosen": SEPARATOR.join(r["answer"] for r in own),
                    "rejected": SEPARATOR.join(r["answer"] for r in other)})
    return out


def encoded_sides(pairs: Sequence[dict[str, str]], tokenizer) -> Iterator[tuple[int, list[int], list[int]]]:
    """(prompt length, prompt + chosen ids, prompt + rejected ids) per pair, by align's own encoder."""
    from align.data.preference import PreferenceRecord, encode_pair

    for i, p in enumerate(pairs):
        rec = PreferenceRecord(id=f"bench:{i}", root="bench", where=f"{PAIRS_FILE}:{i + 1}",
                               prompt=[{"role": "user", "content": p["prompt"]}],
                               chosen={"role": "assistant", "content": p["chosen"]},
                               rejected={"role": "assistant", "content": p["rejected"]})
        yield encode_pair(tokenizer, rec, max_seq_len=1 << 30)


def bundled_tokenizer():
    from align.config import ModelConfig
    from align.data.tokenizer import load_tokenizer

    return load_tokenizer(ModelConfig())


def write_pairs(path: Path, pairs: Sequence[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))


def write_pair_rows(path: Path, pairs: Sequence[dict[str, str]], tokenizer) -> dict[str, Any]:
    """Both sequences of every pair as token rows; returns the token counts (`token_stats`)."""
    lengths = []
    with path.open("w") as f:
        for n_prompt, chosen, rejected in encoded_sides(pairs, tokenizer):
            for ids in (chosen, rejected):
                f.write(json.dumps({"input_ids": ids, "loss_mask": [int(k >= n_prompt) for k in range(len(ids))]})
                        + "\n")
            lengths.append((n_prompt, len(chosen), len(rejected)))
    return token_stats(lengths)


def token_stats(lengths: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    """Per pair as a trainer forwards it (both sequences), per prompt, and every sequence's length
    (chosen, rejected, pair by pair)."""
    per_pair = [c + r for _, c, r in lengths]
    return {"pairs": len(lengths), "tokens_per_pair": sum(per_pair) / len(per_pair),
            "max_tokens_per_pair": max(per_pair), "min_tokens_per_pair": min(per_pair),
            "prompt_tokens": sum(p for p, _, _ in lengths) / len(lengths),
            "longest_sequence": max(max(c, r) for _, c, r in lengths),
            "sequence_lengths": [n for _, c, r in lengths for n in (c, r)]}


def write_bench_data(out: Path, n: int, files: Sequence[str] = (PAIRS_FILE, PAIR_ROWS_FILE)) -> dict[str, Any]:
    """Write the named bench files under `out`; returns the token counts of the pairs."""
    pairs = build_pairs(n)
    tok = bundled_tokenizer()
    if PAIRS_FILE in files:
        write_pairs(out / PAIRS_FILE, pairs)
    if PAIR_ROWS_FILE in files:
        return write_pair_rows(out / PAIR_ROWS_FILE, pairs, tok)
    return token_stats([(n_prompt, len(c), len(r)) for n_prompt, c, r in encoded_sides(pairs, tok)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1024, help="pairs to write (the first N triples)")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench")
    a = ap.parse_args()
    try:
        build_pairs(a.pairs)
    except ValueError as e:
        print(f"bench/pairs.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    a.out.mkdir(parents=True, exist_ok=True)
    stats = write_bench_data(a.out, a.pairs)
    stats.pop("sequence_lengths")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
