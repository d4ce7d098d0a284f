#!/usr/bin/env bash
# Run 27's device call for the branch swiglu-pq: the forward keeps [p | q] = [u * silu'(g) | silu(g)] in place of
# [g | u], so the SwiGLU backward is two products. Steps, each logged under $OUT:
#   1. bench_d_act.py on the branch: d_a GEMM, swiglu_bwd kernel, the pair, the fused launch (bits checked against
#      the pair first) on the five issue-13 shapes;
#   2. energy_probe.py --preset issue13 twice for main and twice for the branch, alternating (main's tree and library
#      against the branch's), plus the fused launch forced on for qwen3-30b-a3b and olmoe-1b-7b on the branch;
#   3. the GPU tests on the branch.
# Step `memory` instead (a second call): bench_moe.py --suite for mok (separate gate and up), mok_gu and the
# grouped_mm path (time and the peak-memory column, with the backward's release_saved), and `mok verify`.
# Usage (repo root of the branch; main's tree at .dev/main_tree, e.g. `git archive main | tar -x -C .dev/main_tree`;
# libraries built from each tree at .build/main and .build/pq):
#   BUDGET_S=560 bash benchmarks/swiglu_pq_check.sh [all|memory]
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MAIN_TREE=${MAIN_TREE:-.dev/main_tree}
PQ_LIB=$PWD/.build/pq/libmok_fast.so; MAIN_LIB=$PWD/.build/main/libmok_fast.so
for f in "$PQ_LIB" "$MAIN_LIB" "$MAIN_TREE/mok/__init__.py"; do
  [ -f "$f" ] || { echo "missing $f"; exit 2; }
done
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${1:-all}" = memory ]; then
  MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout 300 python benchmarks/bench_moe.py --suite --weight-grads bf16 \
    --methods mok,mok_gu,grouped_mm 2>&1 | grep -v -i warn | tee "$OUT/pq_suite_memory.log" | tail -30
  MOK_FAST_LIB=$PQ_LIB PYTHONPATH=$PWD timeout $(( $(left) - 5 )) python -m mok.harness.cli verify --device cuda --no-progress 2>&1 \
    | tee "$OUT/pq_verify.log" | tail -3
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
