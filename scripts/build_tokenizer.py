"""Train the small byte-level BPE tokenizer that ships with align for the tiny presets.

Run once; the output under align/data/assets/tokenizer/ is committed. Re-running on the same corpus
gives the same files (the BPE trainer is deterministic on a fixed input order).

    python scripts/build_tokenizer.py [--vocab-size 4096]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ASSETS = Path(__file__).resolve().parents[1] / "align" / "data" / "assets"
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Assistant turns end with EOS (the token the loss teaches the model to emit); other turns end with
# <|end|>. No text follows EOS, so the rendered prompt of turn i is a token prefix of turn i+1.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' }}{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '<|end|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def corpus(path: Path):
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            yield row["question"]
            yield row["answer"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(ASSETS / "gsm8k" / "train.jsonl"), trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=SPECIALS[3:],
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    out = ASSETS / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    print(f"saved {len(fast)} tokens to {out}")


if __name__ == "__main__":
    main()
