#!/usr/bin/env bash
# Run 26's last device call on main: the backward now frees the [gate; up] concatenation of separate gate and up
# tensors once the d_x GEMM is queued. 1. peak memory and time on the suite shapes where that copy is largest
# (bench_moe.py --suite, mok with separate gate and up, mok_gu with one tensor, the grouped_mm path);
# 2. the GPU tests on this tree.
# Usage (repo root, a library built from this tree): MOK_FAST_LIB=.build/main/libmok_fast.so bash benchmarks/main_check_run26.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CONFIGS="qwen1.5-moe-a2.7b,llama-4-scout,mixtral-8x7b,qwen3-30b-a3b"
case ${1:-all} in
  configs) echo $CONFIGS; exit 0;;  # the suite step's --configs, for a CPU check that each parses
  all) ;;
  *) echo "unknown step $1"; exit 2;;
esac
date -u; git log --oneline -1 2>/dev/null
timeout 150 python benchmarks/bench_moe.py --suite --weight-grads bf16 --methods mok,mok_gu,grouped_mm \
  --configs $CONFIGS 2>&1 | grep -v -i warn | tee "$OUT/suite_memory.log" | tail -16
date -u
timeout 230 python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
date -u
