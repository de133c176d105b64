#!/usr/bin/env bash
# Session 4, round 12 (two GPUs): the tables of docs/performance.md with compiled blocks.
# GPU 0: the dense table, the six arms (+ the eager best) in one invocation.
# GPU 1: MoE: the reference, fused eager default, align_fast, the MFU arms eager and compiled.
set -u
( export CUDA_VISIBLE_DEVICES=0; OUT=$OUT/dense timeout 570 python3 bench/run.py --steps 30 --warmup 8 --align-steps 40 --align-warmup 10 \
    --arms hf_padded,hf_flatten,hf_ceiling,align_shuffle,align_bucket,align_best,align_eager > $OUT/dense.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 570 python3 bench/moe.py --steps 18 --warmup 6 \
    --arms ref,align_step_fill,align_fast,align_ac_32k_quarter,align_ac_32k_fast > $OUT/g1.txt 2>&1 ) &
wait
echo "== dense"; grep -v "Warning\|warn\|^W1\|^V1\|torchao\|^\[\|^{\|Configuration class" $OUT/dense.txt | tail -c 2600
echo "== moe"; grep -v "Warning\|warn\|^W1\|^V1\|torchao\|^\[\|^{\|Configuration class" $OUT/g1.txt | tail -c 2600
grep -h '"dynamo"' $OUT/g1.txt | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['arm'], 'dynamo', json.dumps(r.get('dynamo'))[:300])"
true
