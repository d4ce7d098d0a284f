#!/usr/bin/env bash
# Run 34's device calls: the fused gate/up + SwiGLU launch in the cooperative 128x256 tile where I > 1536 and
# H >= 4096 (mok/fast/_tiles.py, FUSED_GATE_UP_COOP_MIN_H), against run 33's rule (the ping-pong tile everywhere).
# Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   preset-ab  issue 13's preset (energy_probe.py --preset issue13, two rounds) with the two preset shapes the rule
#            changes added under the old rule (OLD_WORKLOADS: the fused kind, the eighth entry of MOK_FAST_GEMM_VARIANT,
#            forced to the ping-pong tile, variant 3);
#   h200     on an H200 only (refuses another card): preset-ab, then the suite, both gate/up layouts against the
#            grouped_mm path (bench_moe.py --suite);
#   da-coop  the d_a + SwiGLU-backward launch (the seventh kind) in the cooperative tile too, on the shapes the new
#            rule changes (DA_WORKLOADS: each as the rule runs it, then with that kind forced to variant 0);
#   tests    the GPU tests of tile choice, determinism and the fused forward (tests/gpu/test_fast_tiles.py,
#            test_fast_determinism.py, test_fast_fused_fwd.py).
# Printing steps for the CPU check (tests/test_device_scripts.py): `old-workloads`, `da-workloads`.
# Usage (repo root, a library built from this tree, carried):
#   MOK_FAST_LIB=$PWD/.build/b32/libmok_fast.so bash benchmarks/main_check_run34.sh h200
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
OLD_WORKLOADS="mok:dsv3-ep8-slice@S0+MOK_FAST_GEMM_VARIANT=,,,,,,,3, mok:mixtral-8x7b+MOK_FAST_GEMM_VARIANT=,,,,,,,3,"
DA_WORKLOADS=""
for shape in dsv3-ep8-slice@S0 mixtral-8x7b dbrx llama-4-scout phi-3.5-moe; do
  DA_WORKLOADS+="mok:$shape mok:$shape+MOK_FAST_GEMM_VARIANT=,,,,,,0,, "
done
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
for step in "$@"; do
  case $step in
    old-workloads) echo $OLD_WORKLOADS;;
    da-workloads) echo $DA_WORKLOADS;;
    h200) nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "h200: not an H200"; exit 3; }
          BUDGET_S=$(( $(left) < 300 ? $(left) : 300 )) bash "$0" preset-ab
          echo "== suite ($(left) s left)"
          timeout $(( $(left) - 5 )) python benchmarks/bench_moe.py --suite --weight-grads bf16 \
            --methods mok,mok_gu,grouped_mm 2>&1 | grep -v -i warn | tee "$OUT/suite.log" | tail -4;;
    preset-ab) echo "== preset-ab ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
               timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $OLD_WORKLOADS --preset issue13 \
                 --seconds 3 --cool 1.5 --rounds 2 2>&1 | grep -v -i warn | tee "$OUT/energy_preset.log" | tail -17;;
    da-coop) echo "== da-coop ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
             timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $DA_WORKLOADS --rounds 2 --seconds 3 \
               --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_da_coop.log" | tail -13;;
    tests) timeout $(( $(left) - 5 )) python -m pytest tests/gpu/test_fast_tiles.py tests/gpu/test_fast_determinism.py \
             tests/gpu/test_fast_fused_fwd.py \
             -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_tiles.log" | tail -3;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in preset-ab|h200|da-coop|tests) date -u;; esac
done
