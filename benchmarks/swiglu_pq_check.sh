#!/usr/bin/env bash
# Run 27's device call for the branch swiglu-pq: the forward keeps [p | q] = [u * silu'(g) | silu(g)] in place of
# [g | u], so the SwiGLU backward is two products. Steps, each logged under $OUT:
#   1. bench_d_act.py on the branch: d_a GEMM, swiglu_bwd kernel, the pair, the fused launch (bits checked against
#      the pair first) on the five issue-13 shapes;
#   2. energy_probe.py --preset issue13 twice for main and twice for the branch, alternating (main's tree and library
#      against the branch's), plus the fused launch forced on for qwen3-30b-a3b and olmoe-1b-7b on the branch;
#   3. the GPU tests on the branch.
# Step `second` instead (a second call, after the rule fused the d_a step at every I): the GPU tests, then
# bench_moe.py --suite for mok (separate gate and up), mok_gu and the grouped_mm path (time and peak memory, with
# the backward's release_saved), shapes the rule changed first.
# Usage (repo root of the branch; main's tree at .dev/main_tree, e.g. `git archive main | tar -x -C .dev/main_tree`;
# libraries built from each tree at .build/main and .build/pq):
#   BUDGET_S=560 bash benchmarks/swiglu_pq_check.sh [all|second]
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MAIN_TREE=${MAIN_TREE:-.dev/main_tree}
PQ_LIB=$PWD/.build/pq/libmok_fast.so; MAIN_LIB=$PWD/.build/main/libmok_fast.so
for f in "$PQ_LIB" "$MAIN_LIB" "$MAIN_TREE/mok/__init__.py"; do
  [ -f "$f" ] || { echo "missing $f"; exit 2; }
done
start=$(date +%s)
# the shapes whose d_a step the run-27 rule moved to the fused launch (I <= 1024) first, then the rest
SUITE_ORDER=qwen3-30b-a3b,olmoe-1b-7b,qwen1.5-moe-a2.7b,granite-3.0-3b-a800m,deepseek-v2-lite,gpt-oss-20b
SUITE_ORDER=$SUITE_ORDER,gpt-oss-120b,qwen3-30b-a3b-t12345,deepseek-v2-lite-t1000,qwen3-235b-a22b,mixtral-8x7b
SUITE_ORDER=$SUITE_ORDER,llama-4-scout,dsv3-ep8-slice,glm-4.5-air,phi-3.5-moe,mixtral-8x22b,mixtral-8x7b-t8000,dbrx
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${1:-all}" = second ]; then
  MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout 175 python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/pq2_gpu_tests.log" | tail -3
  MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout $(( $(left) - 5 )) python benchmarks/bench_moe.py --suite \
    --weight-grads bf16 --methods mok,mok_gu,grouped_mm --configs "$SUITE_ORDER" 2>&1 | grep -v -i warn \
    | tee "$OUT/pq2_suite.log" | tail -62
  date -u; exit 0
fi

echo "== 1. bench_d_act (branch)"
MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout 120 python benchmarks/bench_d_act.py 2>&1 | grep -v -i warn \
  | tee "$OUT/pq_d_act.log" | tail -8

echo "== 2. energy_probe --preset issue13, main / branch alternating ($(left) s left)"
for round in 1 2; do
  (cd "$MAIN_TREE" && MOK_FAST_LIB=$MAIN_LIB PYTHONPATH=$PWD timeout 100 python benchmarks/energy_probe.py \
    --preset issue13 --seconds 3 --cool 1.5 2>&1 | grep -v -i warn > "$OUT/main_energy_$round.log")
  grep "^| mok" "$OUT/main_energy_$round.log" | head -4 | sed "s/^/main $round /"
  extra=""; [ "$round" = 1 ] && extra="fused:qwen3-30b-a3b fused:olmoe-1b-7b unfused:olmoe-1b-7b"
  MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout 120 python benchmarks/energy_probe.py $extra --preset issue13 \
    --seconds 3 --cool 1.5 2>&1 | grep -v -i warn > "$OUT/pq_energy_$round.log"
  grep "^| \(mok\|fused\|unfused\)" "$OUT/pq_energy_$round.log" | head -7 | sed "s/^/pq $round /"
done

echo "== 3. GPU tests (branch, $(left) s left)"
MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout $(( $(left) - 5 )) python -m pytest tests/gpu -q -p no:cacheprovider \
  2>&1 | tee "$OUT/pq_gpu_tests.log" | tail -3
date -u
