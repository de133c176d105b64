"""Evaluation: generate with align.generation, score with align.rewards (or the refusal classifier),
report with provenance. `python -m align.eval` is the command; `evaluate` the in-process call.

    config.py        EvalConfig (the `eval` group) and EvalRunConfig (conf/eval.yaml's root)
    datasets.py      the records: bundled GSM8K test split or a prompts JSONL, checked up front
    model_source.py  export dir or checkpoint -> (model, tokenizer, what the load put in it); identity from
                     file content
    runner.py        one arm: render, generate n samples, score; `evaluate`
    scoring.py       per task: verifier answers or the refusal classifier
    metrics.py       pass@k (unbiased) and maj@k
    refusal.py       hard / deflect / comply classifier and the arm discriminator
    eval_cache.py    the eval cache, keyed on meaning
    eval_record.py   eval.json (present-and-null) and eval.md
    job.py           a `python -m align.eval` job: arms, cache, records, W&B
    eval_checks.py   checks before any model load (exit 2)
"""

from __future__ import annotations

from align.evaluation.runner import evaluate

__all__ = ["evaluate"]
