"""The in-training eval on 2 gloo ranks (parallel=fsdp): every rank generates its share of the prompts
with lockstep decoding (sharded weights make each forward collective), the shares are gathered, and
both ranks hold the same metrics over every record. 5 records: rank 1's share is padded to rank 0's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.distributed import TINY, fit, run

EVAL = ["parallel=fsdp", "trainer.max_steps=3", "eval=gsm8k", "trainer.eval_every=2", "eval.limit=5",
        "eval.max_new_tokens=5"]


def record_evals(trainer, rank: int) -> None:
    run_eval = trainer.evals.run

    def recorded(*a, **k):
        out = run_eval(*a, **k)
        path = Path(trainer.run_dir) / f"rank{rank}" / "evals.jsonl"
        with path.open("a") as f:
            f.write(json.dumps({"step": trainer.state.step, **out, "lockstep": trainer.evals.engine_cfg.lockstep})
                    + "\n")
        return out

    trainer.evals.run = recorded


def test_two_ranks_evaluate_together_and_agree(tmp_path):
    run_dir = tmp_path / "run"
    assert run(fit, 2, str(run_dir), [*TINY, *EVAL, f"data.cache_dir={tmp_path / 'cache'}"], record_evals,
               timeout=300) == [0, 0]
    per_rank = [[json.loads(x) for x in (run_dir / f"rank{r}" / "evals.jsonl").read_text().splitlines()]
                for r in (0, 1)]
    assert [e["step"] for e in per_rank[0]] == [2, 3] == [e["step"] for e in per_rank[1]]
    for a, b in zip(*per_rank):
        assert a["lockstep"] and b["lockstep"]
        assert a["eval/samples"] == 5 == b["eval/samples"]  # every record once, the padding dropped
        keep = [k for k in a if k.startswith("eval/") and not k.endswith("_s") and k != "eval/seconds"]
        assert {k: a[k] for k in keep} == {k: b[k] for k in keep}
    history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history if "eval/pass@1" in r] == [2, 3]
