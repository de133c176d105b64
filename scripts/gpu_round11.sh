#!/usr/bin/env bash
# Session 4, round 11 (two GPUs): the compiled-block arms again, as named in bench/moe.py, with every
# recompile's reason logged; the dense table with compiled blocks (its earlier compiled arms ran
# after the mask check had filled the blocks' compile caches).
set -u
export TORCH_LOGS=recompiles
B="trainer.compile=true trainer.compile_dynamic=true"
( export CUDA_VISIBLE_DEVICES=0; OUT=$OUT/g0 timeout 560 python3 bench/moe.py --steps 20 --warmup 6 \
    --arms ref,align_compiled,align_fast,align_ac_32k_fast > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/dense timeout 560 python3 bench/run.py --steps 30 --warmup 8 --align-steps 40 --align-warmup 10 \
    --arms hf_padded,hf_ceiling,align_best,best_compiled,best_compiled_32k \
    --define "best_compiled=sampler=budget sampler.bucket_size=100000 sampler.mask_padding=false sampler.max_tokens=24576 sampler.pad_to_multiple_of=8 $B" \
    --define "best_compiled_32k=sampler=budget sampler.bucket_size=100000 sampler.mask_padding=false sampler.max_tokens=32768 sampler.pad_to_multiple_of=8 $B" \
    > $OUT/dense.txt 2>&1 ) &
wait
for f in g0 dense; do echo "== $f"; grep -v "Warning\|warn\|^W1\|^V1\|torchao\|^\[\|^{\|Configuration class" $OUT/$f.txt | tail -c 3000; done
grep -h '"dynamo"' $OUT/g0.txt | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['arm'], 'dynamo', json.dumps(r.get('dynamo'))[:300])"
for f in $OUT/g0/moe/align_fast.log $OUT/g0/moe/align_ac_32k_fast.log $OUT/dense/best_compiled.log; do [ -f $f ] || continue; echo "-- recompile reasons in $f"; grep -A1 "triggered by" $f | grep -v "triggered by\|^--" | sed 's/.*\[__recompiles\]//' | cut -c1-200 | sort | uniq -c | head -12; grep -c "recompile_limit" $f; done
