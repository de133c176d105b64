#!/usr/bin/env bash
# Session 4, round 14 (two GPUs): the optimizer GPU tests after the static-shape fix (GPU 0); the
# overlapped compiled optimizer against the reference (GPU 1).
set -u
( export CUDA_VISIBLE_DEVICES=0; OUT=$OUT/g0 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_overlap_compiled_gpu.py \
    tests/gpu/test_compiled_step_gpu.py -p no:cacheprovider > $OUT/g0_test.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 200 python3 bench/moe.py --steps 14 --warmup 6 \
    --arms ref,align_overlap_compiled > $OUT/g1.txt 2>&1 ) &
wait
echo "== gpu tests"; grep -E "^E  |passed|failed" $OUT/g0_test.txt | tail -6
echo "== moe"; grep -v "Warning\|warn\|^W1\|^V1\|torchao\|^\[\|^{\|Configuration class" $OUT/g1.txt | tail -c 1200
grep -h '"optimizer_step"' $OUT/g1.txt | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['arm'], r.get('optimizer_step'), 'dynamo', json.dumps(r.get('dynamo'))[:300])"
grep -h "Error" $OUT/g1/moe/*.log | tail -3
true
