#!/usr/bin/env bash
# Run 36's device calls: what run 35 left unmeasured on an H200 (the card rule on the other large-expert shapes, the
# suite, the per-stage profile), and how far issue 13's shapes are from a floor of dense cuBLAS products.
# Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   first    on an H200: `floor`, then run 35's gu-h200 and suite steps (the fused gate/up kind's two tiles on DBRX,
#            Llama-4-Scout, Phi-3.5-MoE and Mixtral-8x22B; bench_moe.py --suite); on any other card: the whole GPU
#            test suite (tests/gpu), then `floor`;
#   floor    energy_probe.py --preset issue13, two interleaved rounds: issue 13's four shapes and the matmul peak, with
#            the same shapes as dense cuBLAS products of all their rows added (FLOOR_WORKLOADS: `dense:`,
#            dense_floor.py: the same FLOPs, no routing, no memory-bound kernels);
#   profile  on an H200 only: the per-stage profile of docs/fast_path.md (main_check_run28.sh profile).
# Printing step for the CPU check (tests/test_device_scripts.py): `floor-workloads`.
# Usage (repo root, a library built from this tree, carried):
#   MOK_FAST_LIB=$PWD/.build/b32/libmok_fast.so bash benchmarks/main_check_run36.sh first
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FLOOR_WORKLOADS="dense:qwen3-30b-a3b dense:mid-64e@S0 dense:dsv3-ep8-slice@S0 dense:mixtral-8x7b"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
for step in "$@"; do
  case $step in
    floor-workloads) echo $FLOOR_WORKLOADS;;
    first) echo "== first ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           if h200; then BUDGET_S=$(( $(left) < 200 ? $(left) : 200 )) bash "$0" floor
                BUDGET_S=$(left) bash benchmarks/main_check_run35.sh gu-h200 suite
           else timeout $(( $(left) < 260 ? $(left) : 260 )) python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
                  | tee "$OUT/gpu_tests.log" | tail -3
                BUDGET_S=$(left) bash "$0" floor
           fi;;
    floor) echo "== floor ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $FLOOR_WORKLOADS --preset issue13 --rounds 2 \
             --seconds 3 --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_floor.log" | tail -20;;
    profile) h200 || { echo "profile: not an H200"; exit 3; }
             BUDGET_S=$(left) bash benchmarks/main_check_run28.sh profile;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in first|floor|profile) date -u;; esac
done
