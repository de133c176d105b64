#!/usr/bin/env bash
# Session 4, round 13 (two GPUs). First, side by side: GPU tests of the optimizer steppers and MoE
# telemetry (GPU 0); the overlapped compiled optimizer against the compiled one (GPU 1). Then both
# GPUs: the dense best arm (compiled blocks) on one GPU against parallel=fsdp on two.
set -u
( export CUDA_VISIBLE_DEVICES=0; OUT=$OUT/g0 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_overlap_compiled_gpu.py \
    tests/gpu/test_compiled_step_gpu.py tests/gpu/test_overlap_gpu.py tests/gpu/test_moe_telemetry_gpu.py -p no:cacheprovider > $OUT/g0_test.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 230 python3 bench/moe.py --steps 16 --warmup 6 \
    --arms ref,align_compiled,align_overlap_compiled > $OUT/g1.txt 2>&1 ) &
wait
OUT=$OUT/two timeout 300 python3 bench/two_gpu.py --arm align_best > $OUT/two.txt 2>&1
echo "== gpu tests"; tail -4 $OUT/g0_test.txt
echo "== moe"; grep -v "Warning\|warn\|^W1\|^V1\|torchao\|^\[\|^{\|Configuration class" $OUT/g1.txt | tail -c 1500
grep -h '"optimizer_step"' $OUT/g1.txt | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['arm'], r.get('optimizer_step'), 'dynamo', json.dumps(r.get('dynamo'))[:300])"
echo "== two GPUs"; grep -v "Warning\|warn\|^W1\|^V1\|torchao\|^\[\|Configuration class" $OUT/two.txt | tail -c 2000
true
