#!/usr/bin/env bash
# Run 44's device calls. Library B is main with benchmarks/epi_stages_run44.diff (the linear epilogue's bf16 D in 4
# shared-memory store buffers, MOK_LINEAR_STAGES_D; CUTLASS's builder gives 2); library A is main. The down, d_x and
# bf16 weight-gradient GEMMs use that epilogue. Library C is B with benchmarks/dx_tall_wide_run44.diff (the d_x
# kind's variant 5 in 256x192 tiles, the tile SonicMoE's autotuner picked for the DeepSeek-V3 slice's d_x; B's is
# 256x128). Neither diff was kept (benchmarks/RESULTS.md run 44). Steps, each logged under $OUT, each given what is
# left of BUDGET_S (seconds, default 560):
#   tests  with B (TESTS_S seconds at most, default 150): the GPU tests of the GEMMs in every tile variant, the layer's
#          outputs in every variant, and the 2x rule against the reference;
#   prof   profile_fast.py on PROF_SHAPES, A then B (each GEMM launch's time);
#   ab     whole steps (energy_probe.py) of five shapes, A and B in turn, two rounds each (one process a round);
#   dx     the tile tests under C, then whole steps of DX_WORKLOADS under B and C, two rounds (B, C, C, B);
#   gpu    with B: the rest of the GPU tests;
#   ncu    Nsight Compute on every GEMM launch of one step (ncu_peer_steps.py) of NCU_SHAPES without shared experts:
#          mok under library A by the rule, SonicMoE (.sonic carried, unpacked by sonic_env.sh's sonic_unpack), and mok
#          with the down and d_x kinds in variant 5; sections SpeedOfLight, MemoryWorkloadAnalysis, WarpStateStats,
#          SchedulerStats, LaunchStats, Occupancy; logs $OUT/ncu_<shape>_<run>.log.
# Printing steps for the CPU checks (tests/test_device_scripts.py): ab-workloads, dx-workloads.
# Usage (repo root, the libraries carried; each built here: git apply the diffs, MOK_FAST_JOBS=2 python -m
# mok.fast._build OUT.so, git apply -R them):
#   MOK_FAST_LIB_A=$PWD/.build/b41gs/libmok_fast.so MOK_FAST_LIB_B=$PWD/.build/b44sd4/libmok_fast.so \
#     MOK_FAST_LIB_C=$PWD/.build/b44c/libmok_fast.so BUDGET_S=555 bash benchmarks/main_check_run44.sh tests ab dx gpu prof
#   MOK_FAST_LIB_A=$PWD/.build/b41gs/libmok_fast.so BUDGET_S=400 bash benchmarks/main_check_run44.sh ncu  (.sonic carried)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
AB_WORKLOADS="mok:qwen3-30b-a3b mok:olmoe-1b-7b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
DX_WORKLOADS="mok:dsv3-ep8-slice@S0 mok:dsv3-ep8-slice@S0+MOK_FAST_GEMM_VARIANT=,,,5,,,,, mok:mixtral-8x7b
              mok:mixtral-8x7b+MOK_FAST_GEMM_VARIANT=,,,5,,,,, mok:qwen3-30b-a3b mok:mid-64e@S0"
NCU_SHAPES=${NCU_SHAPES:-"dsv3-ep8-slice qwen3-30b-a3b"}
NCU="ncu --profile-from-start off --clock-control none --kernel-name-base demangled -k regex:GemmUniversal|quackgemm
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
  --section LaunchStats --section Occupancy"
PROF_SHAPES=qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
CORE_TESTS="tests/gpu/test_fast_kernels.py tests/gpu/test_fast_tiles.py tests/gpu/test_fast_accuracy.py"
source "$(dirname "$0")/device_budget.sh"
source "$(dirname "$0")/sonic_env.sh"  # the ncu step's SonicMoE
for step in "$@"; do
  case $step in
    tests) echo "== tests ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
           MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap "${TESTS_S:-150}")" python -m pytest -q -p no:cacheprovider \
             $CORE_TESTS 2>&1 | tee "$OUT/gpu_core.log" | tail -6;;
    prof) echo "== prof ($(left) s left)"
          for name in A B; do
            echo "-- library $name" | tee -a "$OUT/prof.log"
            MOK_FAST_LIB=$(lib $name) timeout "$(cap 80)" python benchmarks/profile_fast.py $PROF_SHAPES 2>&1 \
              | grep -v -i warn >> "$OUT/prof.log"
            grep -E "kernel time|GEMM" "$OUT/prof.log" | tail -36 | cut -c1-150
          done;;
    ab) echo "== ab ($(left) s left)"; ab_rounds 2;;
    dx) echo "== dx ($(left) s left)"
        MOK_FAST_LIB=$MOK_FAST_LIB_C timeout "$(cap 60)" python -m pytest -q -p no:cacheprovider \
          tests/gpu/test_fast_tiles.py 2>&1 | tee "$OUT/gpu_tiles_c.log" | tail -3
        for name in B C C B; do
          echo "-- library $name" | tee -a "$OUT/energy_dx.log"
          MOK_FAST_LIB=$(lib $name) energy energy_dx.log 9 90 $DX_WORKLOADS --rounds 1
        done;;
    gpu) echo "== gpu ($(left) s left)"
         MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap 300)" python -m pytest -q -p no:cacheprovider tests/gpu \
           $(for t in $CORE_TESTS; do echo --ignore="$t"; done) 2>&1 | tee "$OUT/gpu_rest.log" | tail -6;;
    ncu) echo "== ncu ($(left) s left)"
         sonic_unpack || echo "ncu: no .sonic/site.tar.xz to unpack"
         for shape in $NCU_SHAPES; do
           for run in rule sonic v5; do
             case $run in
               rule) env=(MOK_FAST_LIB=$MOK_FAST_LIB_A); method=mok_gu;;
               v5) env=(MOK_FAST_LIB=$MOK_FAST_LIB_A MOK_FAST_GEMM_VARIANT=,5,,5,,,,,); method=mok_gu;;
               sonic) env=(); method=sonic;;
             esac
             env "${env[@]}" timeout "$(cap 100 5)" $NCU python benchmarks/ncu_peer_steps.py "$shape" $method \
               > "$OUT/ncu_${shape}_$run.log" 2>&1
             echo "-- $shape $run: $(grep -c "Duration" "$OUT/ncu_${shape}_$run.log") launches"
             grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Hit Rate " \
               "$OUT/ncu_${shape}_$run.log" | cut -c1-110 | head -40
           done
         done;;
    ab-workloads) echo $AB_WORKLOADS;;
    dx-workloads) echo $DX_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in ab-workloads|dx-workloads) ;; *) date -u;; esac
done
