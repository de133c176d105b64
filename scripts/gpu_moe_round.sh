#!/usr/bin/env bash
# MoE round on two GPUs at once: the same arms with and without expandable allocator segments,
# each GPU with its own transformers reference. Usage (after the wheel preamble): bash scripts/gpu_moe_round.sh
set -u
X="trainer.cuda_alloc_conf=expandable_segments:True"
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
AC="sampler.max_tokens=32768 sampler.pad_to_multiple_of=8 parallel.activation_checkpointing=true trainer.loss_chunk_tokens=8192"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 330 python3 bench/moe.py --steps 16 --warmup 4 \
    --arms ref,fill_x,accum4_x,accum8_x,ac32k_x --define "fill_x=$F $X" --define "accum4_x=$F trainer.grad_accum=4 $X" \
    --define "accum8_x=$F trainer.grad_accum=8 $X" --define "ac32k_x=$AC $X" > $OUT/g0.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OUT=$OUT/g1 timeout 330 python3 bench/moe.py --steps 16 --warmup 4 \
    --arms ref,align_step_8k,align_step_fill,align_accum4,align_ac_32k > $OUT/g1.txt 2>&1 ) &
wait
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 3000; done
