#!/usr/bin/env bash
# Run 43's device call: the saved SwiGLU factors [p | q] in 24 bits a value (csrc/swiglu_math.cuh's Pq24Pair: 6I
# bytes a row, not 8I), library B, against main's fp32 [p | q], library A. Steps, each logged under $OUT, each given
# what is left of BUDGET_S (seconds, default 560):
#   apply  git apply benchmarks/pq24_run43.diff (the kernels, the CPU stand-in and the GPU tests of the 24-bit form)
#          unless this tree has it already: the tests step needs its tests, and B is a build of main with it;
#   tests  with B (TESTS_S seconds at most, default 200): the GPU tests of the kernels that write or read [p | q]
#          (the SwiGLU kernels, the fused gate/up and d_a kinds in every tile variant, the layer's outputs in every
#          variant) and the 2x rule against the reference (test_fast_accuracy.py);
#   ab     whole steps (energy_probe.py) of five shapes, A and B in turn, two rounds each (one process a round);
#   ab1    the same, one round each, B first;
#   alone  the gate/up step (bench_gate_up.py) and the d_a step (bench_d_act.py) alone, A then B;
#   gpu    with B: the rest of the GPU tests.
# Printing step for the CPU checks (tests/test_device_scripts.py): ab-workloads.
# Usage (repo root, both libraries carried; B built here: git apply benchmarks/pq24_run43.diff, then
# MOK_FAST_JOBS=2 python -m mok.fast._build .build/b43pq2/libmok_fast.so, and git apply -R it again):
#   MOK_FAST_LIB_A=$PWD/.build/b41gs/libmok_fast.so MOK_FAST_LIB_B=$PWD/.build/b43pq2/libmok_fast.so BUDGET_S=560 \
#     bash benchmarks/main_check_run43.sh apply tests ab alone
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
AB_WORKLOADS="mok:qwen3-30b-a3b mok:olmoe-1b-7b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
ALONE_SHAPES=qwen3-30b-a3b,olmoe-1b-7b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
CORE_TESTS="tests/gpu/test_fast_kernels.py tests/gpu/test_fast_fused.py tests/gpu/test_fast_fused_fwd.py
            tests/gpu/test_fast_tiles.py tests/gpu/test_fast_accuracy.py"
source "$(dirname "$0")/device_budget.sh"
for step in "$@"; do
  case $step in
    apply) git apply --check -R benchmarks/pq24_run43.diff 2>/dev/null && echo "== apply: already applied" \
             || { git apply benchmarks/pq24_run43.diff && echo "== apply: applied"; } || exit 1;;
    tests) echo "== tests ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
           MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap "${TESTS_S:-200}")" python -m pytest -q -p no:cacheprovider \
             $CORE_TESTS 2>&1 | tee "$OUT/gpu_core.log" | tail -6;;
    ab) echo "== ab ($(left) s left)"; ab_rounds 2;;
    ab1) echo "== ab1 ($(left) s left)"; for lib in B A; do ab_round 1 "$lib"; done;;
    alone) echo "== alone ($(left) s left)"
           for name in A B; do
             echo "-- library $name" | tee -a "$OUT/alone.log"
             MOK_FAST_LIB=$(lib $name) timeout "$(cap 70)" python benchmarks/bench_gate_up.py $ALONE_SHAPES \
               --variants 0,3 2>&1 | grep -v -i warn | tee -a "$OUT/alone.log" | tail -7
             MOK_FAST_LIB=$(lib $name) timeout "$(cap 70)" python benchmarks/bench_d_act.py $ALONE_SHAPES --variants 3 \
               2>&1 | grep -v -i warn | tee -a "$OUT/alone.log" | tail -7
           done;;
    gpu) echo "== gpu ($(left) s left)"
         MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap 300)" python -m pytest -q -p no:cacheprovider tests/gpu \
           $(for t in $CORE_TESTS; do echo --ignore="$t"; done) 2>&1 | tee "$OUT/gpu_rest.log" | tail -6;;
    ab-workloads) echo $AB_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in ab-workloads) ;; *) date -u;; esac
done
