#!/usr/bin/env bash
# Run 37's device calls. Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   start    on an H200: run 36's h200-a (the floor beside issue 13's preset, then bench_moe.py --suite); on any other
#            card: `survey`;
#   next     on an H200: run 36's h200-a; on any other card: `stalls`;
#   stalls   Nsight Compute with warp-state and scheduler statistics on the fused gate/up and d_a launches and the d_x
#            launch of one step (the second) of STALL_SHAPES: why the fused launches keep the tensor cores busy less
#            of the time than the plain GEMMs beside them;
#   nostore  a measurement: $PROBE_LIB, a library whose fused gate/up and d_a epilogues do their math and loads but
#            never store (wrong results; benchmarks/no_epi_stores_run37.diff). Nsight Compute (throughputs) on the fused
#            launches and d_x of one step of STALL_SHAPES and qwen3-30b-a3b under $MOK_FAST_LIB and $PROBE_LIB: what
#            the epilogues' register-sourced global stores cost those launches;
#   next2    on an H200: run 36's h200-a; on any other card: `nostore`;
#   batch    a trial: $NEW_LIB, a library whose fused d_a epilogue takes a row half of a sub-tile in three steps (every
#            pair's p and q loads, then the products, then the stores; benchmarks/d_a_batched_run37.diff), so that its
#            stores do not share two source registers; the same bits. The fused-epilogue, tile and determinism GPU
#            tests under it, ncu of the fused launches (as `nostore`) under both libraries, then whole steps
#            (STORE_WORKLOADS) under both, one process each, two rounds;
#   survey   Nsight Compute on every GEMM launch of one forward+backward step (the second) of SURVEY_SHAPES: duration,
#            throughputs, L2 hit rate, DRAM bytes, so that each launch's bound (tensor cores, L2, DRAM) is read off the
#            counters, not guessed;
#   store    a trial: $NEW_LIB, a library whose linear epilogues (down, d_x, the weight gradients) store through TMA
#            with an evict-first L2 hint (benchmarks/tma_store_hint_run37.diff; not kept); the same bits. The whole GPU
#            suite under it, `survey` under it, then whole steps (energy_probe.py, STORE_WORKLOADS) under $MOK_FAST_LIB
#            and $NEW_LIB in turn, one process each, two rounds;
#   final    on an H200: the per-stage profile (run 28's `profile`), then issue 13's preset (one round); on any other
#            card nothing;
#   last     on an H200: `final`; on any other card the per-stage profile alone;
#   coop-da  on an H200: `final`; on any other card `coop-da-steps`;
#   coop-da-steps  whole steps (energy_probe.py, two interleaved rounds) of COOP_DA_SHAPES (default: the small-expert
#            shapes) with the fused d_a GEMM by the rule (ping-pong 128x192, the loaded epilogue) and forced to the
#            cooperative 128x256 tile (COOP_DA_WORKLOADS; N = I = 768 and 1536 are whole 256-column tiles, so the go
#            rows are read by 3 and 6 column tiles instead of 4 and 8), on whatever card this is.
# Usage (repo root, a library built from this tree, carried):
#   MOK_FAST_LIB=$PWD/.build/b36main/libmok_fast.so BUDGET_S=570 bash benchmarks/main_check_run37.sh start
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STORE_WORKLOADS="mok:qwen3-30b-a3b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b mok:olmoe-1b-7b"
source "$(dirname "$0")/workload_pairs.sh"
COOP_DA_WORKLOADS=$(pairs +MOK_FAST_GEMM_VARIANT=,,,,,,0,, ${COOP_DA_SHAPES:-qwen3-30b-a3b mid-64e@S0 olmoe-1b-7b})
STALL_SHAPES=${STALL_SHAPES:-"mixtral-8x7b dsv3-ep8-slice"}
NCU_STALLS="ncu --clock-control none --kernel-name-base demangled -k regex:GateUpPair|SwigluBwd|KHalves --launch-skip 3
  --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
  --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy"
SURVEY_SHAPES=${SURVEY_SHAPES:-"mixtral-8x7b qwen3-30b-a3b"}
NCU="ncu --clock-control none --kernel-name-base demangled -k regex:GemmUniversal --launch-skip 6 --launch-count 6
  --section SpeedOfLight --section MemoryWorkloadAnalysis"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
# On an H200 run 36's h200-a, on any other card step $1 of this script.
h200_or() { nvidia-smi --query-gpu=name --format=csv,noheader
            if h200; then BUDGET_S=$(left) bash benchmarks/main_check_run36.sh h200-a
            else BUDGET_S=$(left) bash "$0" "$1"; fi; }
# Whole steps of STORE_WORKLOADS under $MOK_FAST_LIB and $NEW_LIB in turn, one process each, two rounds; log $OUT/$1.
ab_steps() { for r in 1 2; do
               for lib in $MOK_FAST_LIB $NEW_LIB; do
                 echo "## round $r, library $lib"
                 MOK_FAST_LIB=$lib timeout $(( $(left) < 90 ? $(left) : 90 )) python benchmarks/energy_probe.py \
                   $STORE_WORKLOADS --seconds 2 --cool 1 2>&1 | grep -E "^\| mok|^\| workload"
               done
             done | tee "$OUT/$1"; }
for step in "$@"; do
  case $step in
    start) echo "== start ($(left) s left)"; h200_or survey;;
    next) echo "== next ($(left) s left)"; h200_or stalls;;
    stalls) echo "== stalls ($(left) s left)"
            for s in $STALL_SHAPES; do
              timeout $(( $(left) < 200 ? $(left) : 200 )) $NCU_STALLS python benchmarks/ncu_steps.py $s 2 \
                > "$OUT/ncu_stalls_$s.log" 2>&1
              python benchmarks/ncu_table.py "$OUT/ncu_stalls_$s.log"
              grep -E "Stall|Warp Cycles Per|Issue Slots|Eligible Warps|No Eligible|Registers Per|Executed Ipc" \
                "$OUT/ncu_stalls_$s.log" | head -60
            done;;
    next2) echo "== next2 ($(left) s left)"; h200_or nostore;;
    nostore) echo "== nostore ($(left) s left)"
             for s in $STALL_SHAPES qwen3-30b-a3b; do
               for lib in $MOK_FAST_LIB $PROBE_LIB; do
                 tag=$(basename $(dirname $lib))
                 MOK_FAST_LIB=$lib timeout $(( $(left) < 90 ? $(left) : 90 )) ${NCU_STALLS%%--section*} \
                   --section SpeedOfLight --section MemoryWorkloadAnalysis python benchmarks/ncu_steps.py $s 2 \
                   > "$OUT/ncu_nostore_${s}_$tag.log" 2>&1
                 python benchmarks/ncu_table.py "$OUT/ncu_nostore_${s}_$tag.log"
               done
             done;;
    batch) echo "== batch ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           MOK_FAST_LIB=$NEW_LIB timeout $(( $(left) < 150 ? $(left) : 150 )) python -m pytest \
             tests/gpu/test_fast_fused.py tests/gpu/test_fast_tiles.py tests/gpu/test_fast_determinism.py -q \
             -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_batch.log" | tail -1
           PROBE_LIB=$NEW_LIB BUDGET_S=$(( $(left) < 110 ? $(left) : 110 )) bash "$0" nostore \
             | grep -E "^## |d_a" | tee "$OUT/ncu_batch.log"
           ab_steps energy_batch.log;;
    survey) echo "== survey ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
            for s in $SURVEY_SHAPES; do
              timeout $(( $(left) < 200 ? $(left) : 200 )) $NCU python benchmarks/ncu_steps.py $s 2 \
                > "$OUT/ncu_survey_$s.log" 2>&1
              echo "## $s"; python benchmarks/ncu_table.py "$OUT/ncu_survey_$s.log"
            done;;
    store) echo "== store ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           MOK_FAST_LIB=$NEW_LIB timeout $(( $(left) < 240 ? $(left) : 240 )) python -m pytest tests/gpu -q \
             -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_store.log" | tail -3
           MOK_FAST_LIB=$NEW_LIB OUT=$OUT/new BUDGET_S=$(( $(left) < 60 ? $(left) : 60 )) bash "$0" survey
           ab_steps energy_store.log;;
    final) h200 || { echo "final: not an H200"; exit 3; }
           BUDGET_S=$(( $(left) < 240 ? $(left) : 240 )) bash benchmarks/main_check_run28.sh profile
           grep -E "wall time|cutlass" "$OUT/profile.log" | head -80
           timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py --preset issue13 --seconds 3 --cool 1.5 2>&1 \
             | grep -v -i warn | tee "$OUT/energy_preset.log" | tail -14;;
    last) echo "== last ($(left) s left)"
          if h200; then BUDGET_S=$(left) bash "$0" final
          else BUDGET_S=$(left) bash benchmarks/main_check_run28.sh profile
               grep -E "wall time|cutlass" "$OUT/profile.log" | head -80; fi;;
    coop-da) echo "== coop-da ($(left) s left)"
             if h200; then BUDGET_S=$(left) bash "$0" final; else BUDGET_S=$(left) bash "$0" coop-da-steps; fi;;
    coop-da-steps) timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $COOP_DA_WORKLOADS --rounds 2 \
                     --seconds 2 --cool 1 2>&1 | grep -v -i warn | tee "$OUT/energy_coop_da.log" | tail -16;;
    coop-da-workloads) echo $COOP_DA_WORKLOADS;;
    store-workloads) echo $STORE_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in *-workloads) ;; *) date -u;; esac
done
