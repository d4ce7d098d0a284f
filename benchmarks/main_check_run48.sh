#!/usr/bin/env bash
# Run 48's device call. Library A is main's (the fused gate/up epilogue staged and stored by TMA, merged from
# run 47's library D). E is main with benchmarks/d_a_staged_run48.diff: the d_a epilogue's [dg | du] written back
# into the [p | q] sub-tile it was computed from, once every thread has read it, and stored by TMA through one ragged
# map per segment, in place of bf16 column pairs stored from registers. F is main with
# benchmarks/swiglu_fwd_staged_coop_run48.diff: the fused gate/up epilogue staged and stored by TMA in the cooperative
# tiles too (each warpgroup its own 64 x 8 sub-tiles; 20 KiB, so the mainloop keeps 4 stages), where main stores
# from registers. Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   bits     benchmarks/variant_bits.py under A by the rule, and under E by the rule and in variants 0 and 3, each
#            compared bit for bit with A ($OUT/bits.log);
#   gpu      with E: the GPU tests GPU_TESTS (default tests/gpu, every one) ($OUT/gpu_tests.log);
#   ab       whole steps (energy_probe.py) of AB_WORKLOADS, libraries AB_LIBS (default "E A") in turn, AB_ROUNDS
#            rounds (default 2) ($OUT/energy_ab.log);
#   profile  benchmarks/profile_fast.py of PROFILE_SHAPES under A, then E, PROFILE_ROUNDS rounds (default 1)
#            ($OUT/profiles.log; the launches of each shape, one step);
#   fbits    variant_bits.py under F in variants 0 and 1 (the cooperative tiles) against A by the rule ($OUT/fbits.log);
#   ftests   with F: tests/gpu/test_fast_fused_fwd.py and tests/gpu/test_fast_tiles.py ($OUT/ftests.log);
#   pp       whole steps of PP_WORKLOADS under each of PP_LIBS (default "A F") in turn, PP_ROUNDS rounds (default 2)
#            ($OUT/energy_pp.log): the layers whose fused gate/up launch the rule runs in the cooperative tile on
#            an H100 (I > 1536 and H >= 4096), each as the rule runs it and with that kind (the eighth entry) forced
#            to the ping-pong tile, staged in both libraries: run 34 chose the cooperative tile against the ping-pong
#            one's register stores.
# Printing steps for the CPU checks (tests/test_device_scripts.py): ab-workloads, pp-workloads.
# Usage (repo root, the libraries carried; E built here: git apply the diff, MOK_FAST_JOBS=2 python -m
# mok.fast._build OUT.so, git apply -R it):
#   MOK_FAST_LIB_A=$PWD/.build/b48m/libmok_fast.so MOK_FAST_LIB_E=$PWD/.build/b48e/libmok_fast.so \
#     MOK_FAST_LIB_F=$PWD/.build/b48f/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run48.sh bits gpu ab \
#     profile fbits ftests pp
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
AB_WORKLOADS="mok:qwen3-30b-a3b mok:olmoe-1b-7b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
PROFILE_SHAPES=${PROFILE_SHAPES:-"qwen3-30b-a3b olmoe-1b-7b mid-64e"}
source "$(dirname "$0")/workload_pairs.sh"
PP_WORKLOADS=$(pairs "+MOK_FAST_GEMM_VARIANT=,,,,,,,3," dsv3-ep8-slice@S0 mixtral-8x7b phi-3.5-moe)
source "$(dirname "$0")/device_budget.sh"
rm -f /tmp/bits_A_vrule.pt
for step in "$@"; do
  case $step in
    bits) echo "== bits ($(left) s left)"; bits_against_a bits.log E: E:0 E:3;;
    gpu) echo "== gpu ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
         MOK_FAST_LIB=$(lib E) timeout "$(cap 300)" python -m pytest ${GPU_TESTS:-tests/gpu} -q \
           -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -4;;
    ab) echo "== ab ($(left) s left)"
        for r in $(seq 1 "${AB_ROUNDS:-2}"); do for l in ${AB_LIBS:-E A}; do ab_round "$r" "$l"; done; done;;
    profile) echo "== profile ($(left) s left)"
             for r in $(seq 1 "${PROFILE_ROUNDS:-1}"); do for l in A E; do for c in $PROFILE_SHAPES; do
               echo "#### round $r, library $l, $c" >> "$OUT/profiles.log"
               MOK_FAST_LIB=$(lib $l) timeout "$(cap 40)" python benchmarks/profile_fast.py "$c" 2>&1 \
                 | grep -v -i warn >> "$OUT/profiles.log"
             done; done; done
             grep -E "^####|GEMM pingpong SwiGLU" "$OUT/profiles.log";;
    fbits) echo "== fbits ($(left) s left)"; bits_against_a fbits.log F:0 F:1;;
    ftests) echo "== ftests ($(left) s left)"
            MOK_FAST_LIB=$(lib F) timeout "$(cap 200)" python -m pytest tests/gpu/test_fast_fused_fwd.py \
              tests/gpu/test_fast_tiles.py -q -p no:cacheprovider 2>&1 | tee "$OUT/ftests.log" | tail -3;;
    pp) echo "== pp ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
        for r in $(seq 1 "${PP_ROUNDS:-2}"); do for l in ${PP_LIBS:-A F}; do
          echo "-- round $r, library $l" | tee -a "$OUT/energy_pp.log"
          MOK_FAST_LIB=$(lib "$l") energy energy_pp.log 12 120 $PP_WORKLOADS --rounds 1
        done; done;;
    ab-workloads) echo $AB_WORKLOADS;;
    pp-workloads) echo $PP_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in *-workloads) ;; *) date -u;; esac
done
