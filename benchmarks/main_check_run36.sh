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
#   profile  on an H200 only: the per-stage profile of docs/fast_path_measurements.md (main_check_run28.sh profile);
#   cache    a trial: $CACHE_LIB, one or more libraries (space-separated) whose fused SwiGLU epilogues give the L2 an
#            evict-first hint for the fp32 [p | q] (.build/b36: streaming stores in the gate/up launch and cp.async
#            with an L2 cache policy in the d_a launch; .build/b36b: the d_a launch's only, what main keeps), so that
#            the stream read once does not push the GEMMs' A and B tiles out of L2; the same bits.
#            The fused-epilogue GPU tests under each, then profile_fast.py (CACHE_CONFIGS) and whole steps
#            (energy_probe.py, issue 13's four shapes) under $MOK_FAST_LIB and each in turn, one process each, two
#            rounds; then ncu of qwen3-30b-a3b's d_a launch under each library;
#   h200-a   on an H200 only: `floor` (at most 220 s), then run 35's suite step;
#   h200-b   on an H200 only: run 35's gu-h200 step, then `profile`.
# Printing steps for the CPU check (tests/test_device_scripts.py): `floor-workloads`, `cache-workloads`.
# Usage (repo root, a library built from this tree, carried; `python -m mok.fast._build .build/b36main/libmok_fast.so`):
#   MOK_FAST_LIB=$PWD/.build/b36main/libmok_fast.so BUDGET_S=570 bash benchmarks/main_check_run36.sh h200-a
#   MOK_FAST_LIB=$PWD/.build/b36main/libmok_fast.so BUDGET_S=300 bash benchmarks/main_check_run36.sh h200-b
# Run 36's calls (benchmarks/RESULTS.md): `first` and the trial below under run 32's library (.build/b32, the csrc
# before run 36):
#   MOK_FAST_LIB=$PWD/.build/b32/libmok_fast.so \
#     CACHE_LIB="$PWD/.build/b36b/libmok_fast.so $PWD/.build/b36/libmok_fast.so" \
#     bash benchmarks/main_check_run36.sh cache
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FLOOR_WORKLOADS="dense:qwen3-30b-a3b dense:mid-64e@S0 dense:dsv3-ep8-slice@S0 dense:mixtral-8x7b"
CACHE_CONFIGS=qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
CACHE_WORKLOADS="mok:qwen3-30b-a3b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
NCU="ncu --clock-control none --kernel-name-base demangled -k regex:SwigluBwd --launch-skip 1 --launch-count 1
  --section SpeedOfLight --section MemoryWorkloadAnalysis"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
for step in "$@"; do
  case $step in
    floor-workloads) echo $FLOOR_WORKLOADS;;
    cache-workloads) echo $CACHE_WORKLOADS;;
    cache) echo "== cache ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
           for lib in $CACHE_LIB; do
             MOK_FAST_LIB=$lib timeout $(( $(left) < 150 ? $(left) : 150 )) python -m pytest \
               tests/gpu/test_fast_fused.py tests/gpu/test_fast_fused_fwd.py tests/gpu/test_fast_determinism.py -q \
               -p no:cacheprovider 2>&1 | tail -1
           done | tee "$OUT/gpu_tests_cache.log"
           for lib in $MOK_FAST_LIB $CACHE_LIB; do
             echo "## library $lib"
             MOK_FAST_LIB=$lib timeout 60 python benchmarks/profile_fast.py $CACHE_CONFIGS 2>&1 | grep -v -i warn
           done > "$OUT/profile_cache.log"; grep -E "^## |wall|gate/up|d_a" "$OUT/profile_cache.log" | head -60
           for r in 1 2; do
             for lib in $MOK_FAST_LIB $CACHE_LIB; do
               echo "## round $r, library $lib"
               MOK_FAST_LIB=$lib timeout $(( $(left) < 80 ? $(left) : 80 )) python benchmarks/energy_probe.py \
                 $CACHE_WORKLOADS --seconds 2 --cool 1 2>&1 | grep -E "^\| mok|^\| workload"
             done
           done | tee "$OUT/energy_cache.log"
           for lib in $MOK_FAST_LIB $CACHE_LIB; do
             MOK_FAST_LIB=$lib timeout $(( $(left) < 40 ? $(left) : 40 )) $NCU python benchmarks/ncu_steps.py \
               qwen3-30b-a3b 2 > "$OUT/ncu_d_a_$(basename $(dirname $lib)).log" 2>&1
             grep -E "Duration|DRAM Throughput|L2 Hit Rate" "$OUT/ncu_d_a_$(basename $(dirname $lib)).log"
           done;;
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
    h200-a) h200 || { echo "h200-a: not an H200"; exit 3; }
            BUDGET_S=$(( $(left) < 220 ? $(left) : 220 )) bash "$0" floor
            BUDGET_S=$(left) bash benchmarks/main_check_run35.sh suite;;
    h200-b) h200 || { echo "h200-b: not an H200"; exit 3; }
            BUDGET_S=$(left) bash benchmarks/main_check_run35.sh gu-h200
            BUDGET_S=$(left) bash "$0" profile;;
    profile) h200 || { echo "profile: not an H200"; exit 3; }
             BUDGET_S=$(left) bash benchmarks/main_check_run28.sh profile;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in first|floor|profile|cache) date -u;; esac
done
