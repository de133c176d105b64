#!/usr/bin/env bash
# Two-GPU round: issue 5's fsdp/ep/stop+resume evidence, then the dense two-GPU scaling bench.
# Usage (after the wheel preamble): bash scripts/gpu_dist_round.sh
set -u
timeout 300 python3 scripts/dist_evidence.py > $OUT/dist.txt 2>&1; echo "dist_evidence exit $?"
grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/dist.txt | tail -c 4500
timeout 260 python3 bench/two_gpu.py --steps 40 --warmup 10 --variant "parallel.reshard_after_forward=false" > $OUT/two.txt 2>&1
echo "two_gpu exit $?"; grep -E "^one GPU|^two_gpu|exited|Error" $OUT/two.txt | tail -8
