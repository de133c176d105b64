#!/usr/bin/env bash
# (optimizer.step_first, used by the host_first arms below, was removed after round 7: no measurable effect.)
# Session 3, confirming round (two GPUs): the async telemetry read at the boundary, with the optimizer
# levers, one optimizer step per ~8.5k tokens. GPU 0 and GPU 1 each run their own reference.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 330 python3 bench/moe.py --steps 16 --warmup 5 \
    --arms ref,align_step_fill,host_first,notel,align_overlap \
    --define "host_first=$F optimizer.step_first=false" --define "notel=$F model.moe.telemetry=false" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_compiled_step_gpu.py tests/gpu/test_overlap_gpu.py -p no:cacheprovider > $OUT/g1_test.txt 2>&1;
  OUT=$OUT/g1 timeout 240 python3 bench/moe.py --steps 16 --warmup 5 --arms ref,align_step_fill,opt_compiled \
    --define "opt_compiled=$F optimizer.compile=true" > $OUT/g1.txt 2>&1 ) &
wait
tail -2 $OUT/g1_test.txt
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 3000; done
