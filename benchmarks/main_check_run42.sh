#!/usr/bin/env bash
# Run 42's device call: the d_a + SwiGLU-backward kind (GEMM_NN_SWIGLU_BWD) in two new tile variants, both sharing its
# A tiles (the go rows) between the two CTAs of a 1x2 cluster by TMA multicast, against its L2-bound launch (runs 35
# and 36: L2 throughput 100%, each go row block read once per 192-column tile): variant 4 = the rule's ping-pong
# 128x192 with its loaded epilogue, in 1x2 clusters; variant 5 = cooperative 256x128 in 1x2 clusters with the
# register epilogue (the down and d_x GEMMs' tile since run 41). Steps, each logged under $OUT, each given what is
# left of BUDGET_S (seconds, default 560):
#   tiles  the GPU tests of every tile variant: the fused d_a kind against the unfused pair in every variant
#          (test_fast_fused.py) and the layer's outputs in every variant against variant 0 (test_fast_tiles.py);
#   dact   bench_d_act.py: the d_a step alone in variants 3 (the rule), 4 and 5, bits checked first;
#   ab     whole steps (energy_probe.py, two interleaved rounds) of five shapes by the rule, then with only the d_a
#          kind in variant 4, then in variant 5.
#   split  whole steps (two interleaved rounds) of four shapes the rule keeps out of variant 5 for the down and d_x
#          GEMMs (I > 1536 or H > 4096), by the rule, then with only the down kind in variant 5, then only the d_x
#          kind: run 41 forced the two together (a tie on the DeepSeek-V3 slice, slower on DeepSeek-V2), while
#          SonicMoE's down GEMM on the DeepSeek-V3 slice, in that tile, took 18% less time than mok's (run 40);
#   split-prof  profile_fast.py (each kernel of one step) of the DeepSeek-V3 slice and DeepSeek-V2 by the rule, then
#          with the down and d_x kinds in variant 5: what the tile does to each of the two launches.
# Printing steps for the CPU checks (tests/test_device_scripts.py): ab-workloads, split-workloads.
# The d_a variants are in benchmarks/d_a_shared_a_run42.diff (measured, not merged: benchmarks/RESULTS.md run 42), so
# the tiles, dact and ab steps need a library of main with it applied; split and split-prof need main's own.
# Usage (repo root, such a library carried):
#   MOK_FAST_LIB=$PWD/.build/<build>/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run42.sh tiles dact ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# MOK_FAST_GEMM_VARIANT, MokGemmKind order: the d_a + SwiGLU-backward kind (the seventh entry) in variant 4 or 5
SUFFIXES="+MOK_FAST_GEMM_VARIANT=,,,,,,4,, +MOK_FAST_GEMM_VARIANT=,,,,,,5,,"
source "$(dirname "$0")/workload_pairs.sh"
AB_WORKLOADS=$(each "$SUFFIXES" qwen3-30b-a3b olmoe-1b-7b mid-64e@S0 glm-4.5-air dsv3-ep8-slice@S0)
SPLIT_WORKLOADS=$(each "+MOK_FAST_GEMM_VARIANT=,5,,,,,,, +MOK_FAST_GEMM_VARIANT=,,,5,,,,," dsv3-ep8-slice@S0 \
                deepseek-v2 mixtral-8x7b qwen2-57b-a14b)
DACT_SHAPES=qwen3-30b-a3b,olmoe-1b-7b,mid-64e,glm-4.5-air,dsv3-ep8-slice,mixtral-8x7b
source "$(dirname "$0")/device_budget.sh"
for step in "$@"; do
  case $step in
    tiles) echo "== tiles ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
           timeout "$(cap 220)" python -m pytest -q -p no:cacheprovider \
             tests/gpu/test_fast_fused.py tests/gpu/test_fast_tiles.py 2>&1 | tee "$OUT/gpu_tiles.log" | tail -4;;
    dact) echo "== dact ($(left) s left)"
          timeout "$(cap 150)" python benchmarks/bench_d_act.py $DACT_SHAPES --variants 3,4,5 \
            2>&1 | grep -v -i warn | tee "$OUT/bench_d_act.log" | tail -14;;
    ab) echo "== ab ($(left) s left)"; energy energy_ab.log 20 330 $AB_WORKLOADS --rounds 2;;
    split) echo "== split ($(left) s left)"; energy energy_split.log 16 240 $SPLIT_WORKLOADS --rounds 2;;
    split-prof) echo "== split-prof ($(left) s left)"
                for v in "" ,5,,5,,,,,; do
                  echo "-- MOK_FAST_GEMM_VARIANT=$v" | tee -a "$OUT/profile_split.log"
                  MOK_FAST_GEMM_VARIANT=$v timeout "$(cap 90)" \
                    python benchmarks/profile_fast.py dsv3-ep8-slice,deepseek-v2 2>&1 | grep -v -i warn \
                    | tee -a "$OUT/profile_split.log" \
                    | grep -E "^==|down|d_x|wall"
                done;;
    ab-workloads) echo $AB_WORKLOADS;;
    split-workloads) echo $SPLIT_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in ab-workloads|split-workloads) ;; *) date -u;; esac
done
