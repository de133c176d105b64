#!/usr/bin/env bash
# Gemma-4 262k-vocab logits memory (GPU 0) and the MoE step clock check (GPU 1), at once.
set -u
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 200 python3 bench/vocab.py --steps 8 > $OUT/vocab.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OUT=$OUT/g1 timeout 200 python3 bench/moe.py --steps 14 --warmup 4 --arms align_step_fill > $OUT/moe.txt 2>&1 ) &
wait
grep -E "^full_logits|^chunked" $OUT/vocab.txt; grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/moe.txt | tail -c 1500
