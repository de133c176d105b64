#!/usr/bin/env bash
# (optimizer.step_first, used by the host_first arms below, was removed after round 7: no measurable effect.)
# Session 3, round 2 (two GPUs at once). GPU 0: the MoE one-step-per-8k arms with the step-first
# boundary (now the default) against it turned off, with and without overlap, then the kernel tables
# and idle gaps of two arms. GPU 1: GPU tests, the optimizer-alone micro-benchmark.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 560 python3 bench/moe.py --steps 16 --warmup 4 \
    --arms ref,host_first,align_step_fill,host_first_overlap,align_overlap \
    --define "host_first=$F optimizer.step_first=false" --define "host_first_overlap=$F optimizer.step_first=false optimizer.overlap=true" \
    --profile align_step_fill,align_overlap > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_overlap_gpu.py tests/gpu/test_probes_gpu.py -p no:cacheprovider > $OUT/g1_test.txt 2>&1;
  timeout 300 python3 bench/optim_kernels.py > $OUT/g1_optim.txt 2>&1 ) &
wait
tail -4 $OUT/g1_test.txt; grep -v "^W1\|Warn\|warn" $OUT/g1_optim.txt | tail -9
echo "== g0"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/g0.txt | grep -v "^| [0-9.]* | [0-9]* | \(elementwise\|other\|gemm\|attention\|memcpy\)" | tail -c 9000
