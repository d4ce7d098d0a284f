#!/usr/bin/env bash
# Run 41's device call: the fused gate/up + SwiGLU kind in 2x1 clusters (csrc/mainloop_gate_up.cuh now shares B by
# TMA multicast, so its variants 1 and 2 are cooperative 128x256 and ping-pong 128x192 in 2x1 clusters, the tile
# SonicMoE's autotuner picks for its gathered gate/up), and run 40's tile variant 5 (cooperative 256x128 in 1x2
# clusters for the down and d_x kinds). Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds,
# default 560):
#   tiles  the GPU tests of every tile variant: the fused gate/up kind against the unfused pair and every variant
#          against variant 0, bit for bit (test_fast_fused_fwd.py, test_fast_tiles.py, test_fast_dx_halves.py);
#   ab     whole steps (energy_probe.py, two interleaved rounds) of issue 13's four shapes: by the rule, with the down
#          and d_x kinds in variant 5, and with the fused gate/up kind in variant 1 and in variant 2;
#   mid    the same for the suite's ten shapes with I <= 1536 (where the rule runs the row-tiled kinds ping-pong; ab
#          found variant 5 3.5% faster on mid-64e): by the rule, down and d_x in variant 5, the gate/up in variant 1,
#          and both.
#   prof   profile_fast.py (each kernel of one step) of Qwen3-30B-A3B and mid-64e by the rule, then with the down and
#          d_x kinds in variant 5 and the gate/up in variant 1: which launches the variants change, and by how much.
#   gpu    every GPU test (tests/gpu) with the rule of run 41 (down and d_x in variant 5 for mid-sized experts);
#   targets energy_probe.py --preset issue13, two interleaved rounds: issue 13's targets with that rule;
#   suite-tall bench_moe.py --suite on three shapes whose down and d_x the rule now runs in variant 5, against the
#          grouped_mm path (bf16 weight gradients).
#   gather-coop  benchmarks/gather_producer_probe.cu's wgmma consumer in the ping-pong 128x192 tile (run 33's) and
#          in the cooperative 128x256 one (SonicMoE's gathered gate/up tile, without its 2x1 clusters), A by one TMA
#          or gathered by four cp.async warps (and the same four reading contiguous rows), on Qwen3-30B-A3B's and
#          mid-64e's gate/up shapes: whether the cooperative tile hides the gather that cost run 33's tile 24%.
#          $PROBE: the probe built on the CPU box (default .build/probe/gather_probe, carried).
# Printing steps for the CPU checks (tests/test_device_scripts.py): ab-workloads, mid-workloads, tall-suite.
# Usage (repo root, a library of this tree carried):
#   MOK_FAST_LIB=$PWD/.build/<build>/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run41.sh tiles ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# MOK_FAST_GEMM_VARIANT, MokGemmKind order: down (TN_BF16) and d_x (NN_BF16) in variant 5; the fused gate/up
# (TN_SWIGLU_FWD) in variant 1 or 2
SUFFIXES="+MOK_FAST_GEMM_VARIANT=,5,,5,,,,, +MOK_FAST_GEMM_VARIANT=,,,,,,,1, +MOK_FAST_GEMM_VARIANT=,,,,,,,2,"
source "$(dirname "$0")/workload_pairs.sh"
AB_WORKLOADS=$(each "$SUFFIXES" qwen3-30b-a3b mid-64e@S0 dsv3-ep8-slice@S0 mixtral-8x7b)
MID_SUFFIXES="+MOK_FAST_GEMM_VARIANT=,5,,5,,,,, +MOK_FAST_GEMM_VARIANT=,,,,,,,1, +MOK_FAST_GEMM_VARIANT=,5,,5,,,,1,"
MID_WORKLOADS=$(each "$MID_SUFFIXES" qwen3-30b-a3b qwen3-235b-a22b olmoe-1b-7b deepseek-v2-lite glm-4.5-air \
                granite-3.0-3b-a800m qwen3-next-80b-a3b deepseek-v2 qwen1.5-moe-a2.7b mid-64e)
TALL_SUITE=qwen1.5-moe-a2.7b,glm-4.5-air,olmoe-1b-7b  # suite.json shapes the rule now runs tall
PROBE=${PROBE:-.build/probe/gather_probe}
source "$(dirname "$0")/device_budget.sh"
for step in "$@"; do
  case $step in
    tiles) echo "== tiles ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
           timeout "$(cap 200)" python -m pytest -q -p no:cacheprovider \
             tests/gpu/test_fast_fused_fwd.py tests/gpu/test_fast_tiles.py tests/gpu/test_fast_dx_halves.py 2>&1 \
             | tee "$OUT/gpu_tiles.log" | tail -4;;
    ab) echo "== ab ($(left) s left)"; energy energy_ab.log 22 600 $AB_WORKLOADS --rounds 2;;
    mid) echo "== mid ($(left) s left)"; energy energy_mid.log 44 600 $MID_WORKLOADS --rounds 2;;
    prof) echo "== prof ($(left) s left)"
          for v in "" ,5,,5,,,,1,; do
            echo "-- MOK_FAST_GEMM_VARIANT=$v" | tee -a "$OUT/profile_mid.log"
            MOK_FAST_GEMM_VARIANT=$v timeout "$(cap 90)" python benchmarks/profile_fast.py \
              qwen3-30b-a3b,mid-64e 2>&1 | grep -v -i warn | tee -a "$OUT/profile_mid.log" | grep -E "^==|GEMM|wall"
          done;;
    gpu) echo "== gpu ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
         timeout "$(cap 280)" python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
           | tee "$OUT/gpu_tests.log" | tail -3;;
    targets) echo "== targets ($(left) s left)"; energy energy_targets.log 16 150 --preset issue13 --rounds 2;;
    suite-tall) echo "== suite-tall ($(left) s left)"
                timeout "$(cap 600 5)" python benchmarks/bench_moe.py --suite --weight-grads bf16 \
                  --methods mok_gu,grouped_mm --configs $TALL_SUITE 2>&1 | grep -v -i warn | tee "$OUT/suite_tall.log" \
                  | tail -12;;
    gather-coop) echo "== gather-coop ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
                 # gate/up column tiles: 2I / 192 (ping-pong) and 2I / 256 (cooperative)
                 for shape in "--tokens 16384 --hidden 2048 --topk 8:8:6" \
                              "--tokens 8192 --hidden 4096 --topk 6:16:12"; do
                   IFS=: read -r dims n_pp n_co <<< "$shape"
                   for tile in "pingpong $n_pp" "coop $n_co"; do
                     read -r tile_name n_tiles <<< "$tile"
                     for mode in "--mode tma" "--mode cpasync --warps 4" "--mode cpasync --warps 4 --contiguous"; do
                       timeout 30 "$PROBE" $mode $dims --n-tiles $n_tiles --consumer wgmma --tile $tile_name
                     done
                   done
                 done 2>&1 | tee "$OUT/gather_coop.log";;
    tall-suite) echo $TALL_SUITE;;
    ab-workloads) echo $AB_WORKLOADS;;
    mid-workloads) echo $MID_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in ab-workloads|mid-workloads|tall-suite) ;; *) date -u;; esac
done
