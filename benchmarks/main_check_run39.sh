#!/usr/bin/env bash
# Run 39's device calls. Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   pdl-ab     with a library built from main + benchmarks/pdl_run39.diff (kernels launched with programmatic
#              dependent launch, PDL): whole steps (energy_probe.py, three interleaved rounds) of issue 13's four
#              shapes and OLMoE-1B-7B, each as that library launches it and with MOK_FAST_PDL=0 (as main launches);
#   tests      python -m pytest tests/gpu (1000 reruns, batch invariance, graph replay, sanitizer, the 2x rule);
#   suite-new  bench_moe.py --suite on the four shapes added to suite.json in run 39 (Qwen2-57B-A14B, Qwen3-Next-80B-A3B,
#              DeepSeek-V2, Grok-1), the methods and weight gradients of run 35's suite step;
#   next-tiles Qwen3-Next-80B-A3B (I = 512, 160 rows an expert at T = 8192, E = 512, K = 10: the suite's lowest
#              share of the peak, 32% on an H100) and DeepSeek-V2: whole steps (energy_probe.py, two interleaved
#              rounds) by the rule (ping-pong 128x192: I / 192 and I / 96 leave a last column tile part empty) against
#              the row-tiled kinds forced to the cooperative 128x256 tile (all, or only the fused gate/up or d_a
#              kind), then qwen3-next's per-stage profile;
#   short-tiles with a library built from main + benchmarks/tile64_run39.diff (tile variant 5: ping-pong 64x256, 64-row
#              tiles; measured in run 39 and not kept): whole steps (energy_probe.py, two interleaved rounds) of six
#              shapes by the rule and with the row-tiled kinds forced to variant 5:
#              many experts a pick (Qwen3-Next-80B-A3B, DeepSeek-V2, gpt-oss-120b, DeepSeek-V2-Lite at T = 1000: 94
#              to 307 rows an expert) and two controls (Qwen3-30B-A3B, OLMoE-1B-7B: 1024 and 2048);
#   h200       on an H200 only: run 38's settle (issue 13's preset, three rounds) and da-coop steps.
# Printing steps for the CPU checks (tests/test_device_scripts.py): pdl-workloads, new-shapes, tile-workloads,
# short-workloads.
# Usage (repo root, a build carried):
#   MOK_FAST_LIB=$PWD/.build/b39pdl/libmok_fast.so BUDGET_S=420 bash benchmarks/main_check_run39.sh pdl-ab tests
#   MOK_FAST_LIB=$PWD/.build/b39main/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run39.sh suite-new h200
#   MOK_FAST_LIB=$PWD/.build/b39t64/libmok_fast.so BUDGET_S=585 bash benchmarks/main_check_run39.sh short-tiles tests
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/workload_pairs.sh"
PDL_WORKLOADS=$(pairs +MOK_FAST_PDL=0 qwen3-30b-a3b mid-64e@S0 dsv3-ep8-slice@S0 mixtral-8x7b olmoe-1b-7b)
ROW_TILED_COOP=0,0,0,0,,,0,0,  # MOK_FAST_GEMM_VARIANT: the row-tiled kinds cooperative, the weight gradients by the rule
TILE_WORKLOADS="$(pairs +MOK_FAST_GEMM_VARIANT=$ROW_TILED_COOP qwen3-next-80b-a3b deepseek-v2)"
TILE_WORKLOADS="$TILE_WORKLOADS mok:qwen3-next-80b-a3b+MOK_FAST_GEMM_VARIANT=,,,,,,,0, mok:qwen3-next-80b-a3b+MOK_FAST_GEMM_VARIANT=,,,,,,0,,"
ROW_TILED_SHORT=5,5,5,5,,,5,5,  # the row-tiled kinds in 64-row tiles
SHORT_WORKLOADS=$(pairs +MOK_FAST_GEMM_VARIANT=$ROW_TILED_SHORT qwen3-next-80b-a3b deepseek-v2 gpt-oss-120b \
                  deepseek-v2-lite-t1000 qwen3-30b-a3b olmoe-1b-7b)
NEW_SHAPES=qwen2-57b-a14b,qwen3-next-80b-a3b,deepseek-v2,grok-1
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
for step in "$@"; do
  case $step in
    pdl-ab) echo "== pdl-ab ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
            timeout $(( $(left) < 220 ? $(left) : 220 )) python benchmarks/energy_probe.py $PDL_WORKLOADS --rounds 3 \
              --seconds 2 --cool 1 2>&1 | grep -v -i warn | tee "$OUT/energy_pdl.log" | tail -14;;
    tests) echo "== tests ($(left) s left)"
           timeout $(( $(left) < 240 ? $(left) : 240 )) python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
             | tee "$OUT/gpu_tests.log" | tail -3;;
    suite-new) echo "== suite-new ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
               timeout $(( $(left) < 240 ? $(left) : 240 )) python benchmarks/bench_moe.py --suite --weight-grads bf16 \
                 --methods mok,mok_gu,grouped_mm --configs $NEW_SHAPES 2>&1 | grep -v -i warn \
                 | tee "$OUT/suite_new.log" | tail -20;;
    next-tiles) echo "== next-tiles ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
                timeout $(( $(left) < 150 ? $(left) : 150 )) python benchmarks/energy_probe.py $TILE_WORKLOADS \
                  --rounds 2 --seconds 2 --cool 1 2>&1 | grep -v -i warn | tee "$OUT/energy_tiles.log" | tail -10
                timeout $(( $(left) < 90 ? $(left) : 90 )) python benchmarks/profile_fast.py qwen3-next-80b-a3b 2>&1 \
                  | grep -v -i warn > "$OUT/profile_qwen3_next.log"; grep -E "wall time|cutlass|ms  " \
                  "$OUT/profile_qwen3_next.log" | head -40;;
    short-tiles) echo "== short-tiles ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
                 timeout $(( $(left) < 200 ? $(left) : 200 )) python benchmarks/energy_probe.py $SHORT_WORKLOADS \
                   --rounds 2 --seconds 2 --cool 1 2>&1 | grep -v -i warn | tee "$OUT/energy_short.log" | tail -15;;
    h200) h200 || { echo "h200: not an H200"; continue; }
          BUDGET_S=$(left) bash benchmarks/main_check_run38.sh settle da-coop;;
    pdl-workloads) echo $PDL_WORKLOADS;;
    new-shapes) echo $NEW_SHAPES;;
    tile-workloads) echo $TILE_WORKLOADS;;
    short-workloads) echo $SHORT_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in *-workloads|new-shapes) ;; *) date -u;; esac
done
