#!/usr/bin/env bash
# Run 29's device calls on main. Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default
# 560) after the steps before:
#   ep-tests  the expert-parallel GPU tests and the release tests (run_backward_ep now drops its d_x rows and frees the
#             x rows before the down gradients): tests/gpu/test_fast_ep*.py, tests/gpu/test_fast_release_memory.py;
#   d-act     whole steps with the SwiGLU backward fused into the d_a GEMM (the rule since run 27) and apart, on the
#             two many-small-expert shapes where run 27 chose fusion on an H200: energy_probe.py, two rounds;
#   tests     python -m pytest tests/gpu, the whole GPU suite on this session's code (at most TESTS_S s, default 300),
#             then `mok verify --device cuda`;
#   h200      on an H200 only (the card issue 13's table is measured on): `main_check_run28.sh profile preset`.
# Printing step for the CPU check (tests/test_device_scripts.py): `workloads`.
# Usage (repo root, a library built from this tree):
#   MOK_FAST_LIB=$PWD/.build/cur/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run29.sh ep-tests d-act h200
#   MOK_FAST_LIB=$PWD/.build/cur/libmok_fast.so BUDGET_S=580 bash benchmarks/main_check_run29.sh h200 tests
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORKLOADS="fused:qwen3-30b-a3b unfused:qwen3-30b-a3b fused:olmoe-1b-7b unfused:olmoe-1b-7b"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
for step in "$@"; do
  case $step in
    workloads) echo $WORKLOADS;;
    ep-tests) date -u; nvidia-smi --query-gpu=name --format=csv,noheader
              timeout $(( $(left) < 150 ? $(left) : 150 )) python -m pytest tests/gpu/test_fast_ep.py \
                tests/gpu/test_fast_ep_kernels.py tests/gpu/test_fast_release_memory.py -q -p no:cacheprovider 2>&1 \
                | tee "$OUT/ep_tests.log" | tail -3;;
    d-act) echo "== d-act ($(left) s left)"
           timeout $(( $(left) < 150 ? $(left) : 150 )) python benchmarks/energy_probe.py $WORKLOADS --seconds 3 \
             --cool 1.5 --rounds 2 2>&1 | grep -v -i warn | tee "$OUT/d_act.log" | tail -8;;
    tests) date -u; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) < ${TESTS_S:-300} ? $(left) : ${TESTS_S:-300} )) python -m pytest tests/gpu -q \
             -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
           timeout 60 python -m mok.harness.cli verify --device cuda --no-progress 2>&1 | tee "$OUT/verify.log" | tail -2;;
    h200) if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
            BUDGET_S=$(( $(left) - 5 )) bash benchmarks/main_check_run28.sh profile preset
          else echo "== h200: not an H200, skipped"; fi;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in ep-tests|d-act|tests) date -u;; esac
done
