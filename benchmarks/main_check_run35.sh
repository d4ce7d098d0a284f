#!/usr/bin/env bash
# Run 35's device calls. First a trial: the d_a + SwiGLU-backward launch (GEMM_NN_SWIGLU_BWD, the seventh entry of
# MOK_FAST_GEMM_VARIANT) with 16-byte [dg | du] stores (tile variant 4: the lanes of a quad swap their products first)
# against the rule's variant 3 (4-byte stores); same tile, same bits. That trial needs a library built from this tree
# with benchmarks/quad_stores_run35.diff applied (`git apply`, on the csrc of 7509c90; not kept: no faster). Then
# the fused gate/up kind's tile on an H200 (mok/fast/_tiles.py, FUSED_GATE_UP_PINGPONG_CARDS: ping-pong there for
# every layer).
# Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   tests    the GPU tests of tile variants, the fused d_a launch and the fused forward (tests/gpu/test_fast_tiles.py,
#            test_fast_fused.py, test_fast_fused_fwd.py: every variant against variant 0, bit for bit);
#   quad     whole steps, energy_probe.py, two interleaved rounds: QUAD_WORKLOADS, each shape as the rule runs it
#            and with the kind forced to variant 4;
#   ncu      Nsight Compute on qwen3-30b-a3b's d_a launch (the second step's) in each of NCU_VARIANTS (default "3 4"):
#            speed of light, memory, warp stalls (benchmarks/ncu_steps.py);
#   da-v2    whole steps of many-small-expert shapes (DA_V2_WORKLOADS) as the rule runs them and with the d_a kind in
#            the 2x1-cluster ping-pong tile (the seventh entry forced to variant 2: B tiles multicast to two CTAs, half
#            the L2 reads of w_down), energy_probe.py, two interleaved rounds;
#   gaps     step_gaps.py on qwen3-30b-a3b and mid-64e (bf16 weight gradients, as the preset runs them): where the GPU
#            idles between queued steps' kernels;
#   raster   whole steps (RASTER_WORKLOADS) in CUTLASS's default tile order (along M) and along N
#            (MOK_FAST_GEMM_RASTER=N, every GEMM: the N tiles of one row block run side by side, so its A rows are read
#            from DRAM once), two interleaved rounds; then ncu of qwen3-30b-a3b's d_a launch along N;
#   h200     on an H200 only (refuses another card): run 34's preset-ab (issue 13's preset, BUDGET_S at most 300);
#   gu-h200  on an H200 only: whole steps of the large-expert suite shapes (GU_WORKLOADS) as the rule runs them there
#            (the fused gate/up kind ping-pong) and with that kind cooperative (the eighth entry forced to variant 0),
#            energy_probe.py, two interleaved rounds;
#   suite    bench_moe.py --suite, both gate/up layouts against the grouped_mm path, bf16 weight gradients.
# Printing steps for the CPU check (tests/test_device_scripts.py): `quad-workloads`, `gu-workloads`, `da-v2-workloads`,
# `raster-workloads`.
# Usage (repo root, a library built from this tree, carried):
#   MOK_FAST_LIB=$PWD/.build/b35/libmok_fast.so bash benchmarks/main_check_run35.sh tests quad
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/workload_pairs.sh"
QUAD_WORKLOADS=$(pairs +MOK_FAST_GEMM_VARIANT=,,,,,,4,, qwen3-30b-a3b olmoe-1b-7b mid-64e@S0 dsv3-ep8-slice@S0 \
  mixtral-8x7b)
GU_WORKLOADS=$(pairs +MOK_FAST_GEMM_VARIANT=,,,,,,,0, dbrx llama-4-scout phi-3.5-moe mixtral-8x22b)
DA_V2_WORKLOADS=$(pairs +MOK_FAST_GEMM_VARIANT=,,,,,,2,, qwen3-30b-a3b olmoe-1b-7b mid-64e@S0 glm-4.5-air \
  granite-3.0-3b-a800m)
RASTER_WORKLOADS=$(pairs +MOK_FAST_GEMM_RASTER=N qwen3-30b-a3b olmoe-1b-7b mid-64e@S0)
NCU="ncu --clock-control none --kernel-name-base demangled -k regex:SwigluBwd --launch-skip 1 --launch-count 1
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
  --section LaunchStats --section Occupancy"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
for step in "$@"; do
  case $step in
    quad-workloads) echo $QUAD_WORKLOADS;;
    gu-workloads) echo $GU_WORKLOADS;;
    da-v2-workloads) echo $DA_V2_WORKLOADS;;
    raster-workloads) echo $RASTER_WORKLOADS;;
    raster) echo "== raster ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
            timeout $(( $(left) - 40 )) python benchmarks/energy_probe.py $RASTER_WORKLOADS --rounds 2 --seconds 3 \
              --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_raster.log" | tail -9
            MOK_FAST_GEMM_RASTER=N timeout 35 $NCU python benchmarks/ncu_steps.py qwen3-30b-a3b 2 > "$OUT/ncu_d_a_rasterN.log" 2>&1
            grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate" "$OUT/ncu_d_a_rasterN.log";;
    da-v2) echo "== da-v2 ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $DA_V2_WORKLOADS --rounds 2 --seconds 3 \
             --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_da_v2.log" | tail -13;;
    tests) echo "== tests ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) < 200 ? $(left) : 200 )) python -m pytest tests/gpu/test_fast_tiles.py \
             tests/gpu/test_fast_fused.py tests/gpu/test_fast_fused_fwd.py -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_quad.log" | tail -3;;
    quad) echo "== quad ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
          timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $QUAD_WORKLOADS matmul --rounds 2 --seconds 3 \
            --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_quad.log" | tail -14;;
    ncu) echo "== ncu ($(left) s left)"
         for v in ${NCU_VARIANTS:-3 4}; do
           MOK_FAST_GEMM_VARIANT=,,,,,,$v,, timeout $(( $(left) < 120 ? $(left) : 120 )) $NCU \
             python benchmarks/ncu_steps.py qwen3-30b-a3b 2 > "$OUT/ncu_d_a_v$v.log" 2>&1
           grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Stall|Registers Per" "$OUT/ncu_d_a_v$v.log" \
             | head -12
         done;;
    gaps) echo "== gaps ($(left) s left)"
          timeout $(( $(left) < 90 ? $(left) : 90 )) python benchmarks/step_gaps.py qwen3-30b-a3b,mid-64e \
            --weight-grads bf16 2>&1 | grep -v -i warn | tee "$OUT/step_gaps.log" | grep "steps queued";;
    h200) nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "h200: not an H200"; exit 3; }
          BUDGET_S=$(( $(left) < 300 ? $(left) : 300 )) bash benchmarks/main_check_run34.sh preset-ab;;
    gu-h200) nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "gu-h200: not an H200"; exit 3; }
             echo "== gu-h200 ($(left) s left)"
             timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $GU_WORKLOADS --rounds 2 --seconds 3 \
               --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_gu_h200.log" | tail -11;;
    suite) echo "== suite ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) - 5 )) python benchmarks/bench_moe.py --suite --weight-grads bf16 \
             --methods mok,mok_gu,grouped_mm 2>&1 | grep -v -i warn | tee "$OUT/suite.log" | tail -6;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in tests|quad|ncu|gaps|h200|gu-h200|suite|da-v2|raster) date -u;; esac
done
