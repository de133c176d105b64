#!/usr/bin/env bash
# The DPO and generation benchmarks on one GPU, in one command, inside a time budget (default 540 s,
# SUITE_BUDGET_S), written for one H200 (docs/performance.md, "DPO" and "Generation"):
#   1. DPO (bench/run.py, one table): TRL's DPOTrainer with a reference copy and with precomputed
#      reference log-probs, align's best arm (precomputed, compiled blocks), its best with a live
#      reference, align at TRL's batch shape (the memory comparison), and SFT (dense_best's levers) on
#      the pairs' own sequences (the tokens/s ratio);
#   2. generation (bench/generation.py): plain generate against align's engines (hf modes, align eager/graphs);
#   3. if time is left: align's eager arms, one per reference strategy (dpo_ref_model, dpo_precomputed).
# Each command gets a deadline inside the budget (no arm starts after it, a running one is killed at
# it, both recorded), so the suite ends in time and always writes its summary. Everything the arms
# write goes under SUITE_WORK (default /tmp/align-bench); DEST gets three files (summary.md,
# summary.json, arms.tar.gz with each arm's JSON, log, history and provenance).
#
#   bash bench/gpu_suite.sh DEST
#   SUITE_DRY_RUN=1 bash bench/gpu_suite.sh DEST    # validate every arm, print the commands, run nothing
#
# On the GPU machine, after the wheels (docs/performance.md, "Reproduce"):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; bash bench/gpu_suite.sh $OUT
set -uo pipefail
DEST=${1:?usage: bash bench/gpu_suite.sh DEST}
BUDGET=${SUITE_BUDGET_S:-540}
WORK=${SUITE_WORK:-/tmp/align-bench}
GEN_RESERVE=${SUITE_GENERATION_S:-110}   # seconds kept back for the generation bench
PY=${PYTHON:-python3}
DRY=()
[ "${SUITE_DRY_RUN:-0}" = 1 ] && DRY=(--dry-run)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
mkdir -p "$WORK" "$DEST"

"$PY" - <<'EOF'
import importlib.metadata as m
names = ["torch", "transformers", "trl", "datasets", "accelerate", "pyarrow", "pandas", "xxhash", "dill",
         "multiprocess", "fsspec", "huggingface-hub", "hydra-core", "omegaconf"]
def version(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return "MISSING"
print("versions:", ", ".join(f"{n} {version(n)}" for n in names), flush=True)
EOF

echo "== 1. DPO: TRL arms, align arms, SFT on the same rows (deadline $(( $(left) - GEN_RESERVE ))s)"
OUT=$WORK/dpo "$PY" bench/run.py trl_dpo_ref trl_dpo_precomputed dpo_best dpo_best_ref dpo_trl_shape \
  sft_pairs_best --steps 30 --warmup 10 --hf-steps 20 --hf-warmup 5 --pairs 1024 \
  --baseline trl_dpo_ref,trl_dpo_precomputed --deadline $(( $(left) - GEN_RESERVE )) "${DRY[@]}"

echo "== 2. generation ($(left)s left)"
OUT=$WORK/generation timeout --kill-after=5 $(( $(left) > 30 ? $(left) - 20 : 10 )) "$PY" bench/generation.py \
  "${DRY[@]}"

if [ "$(left)" -gt 90 ]; then
  echo "== 3. eager arms, one per reference strategy ($(left)s left)"
  OUT=$WORK/dpo_eager "$PY" bench/run.py dpo_ref_model dpo_precomputed --steps 30 --warmup 10 --pairs 1024 \
    --deadline $(( $(left) - 15 )) "${DRY[@]}"
else
  echo "== 3. eager arms skipped: $(left)s left"
fi

[ ${#DRY[@]} -gt 0 ] && exit 0
"$PY" bench/suite_summary.py "$WORK" "$DEST"
echo "suite: $(( $(date +%s) - start ))s"
