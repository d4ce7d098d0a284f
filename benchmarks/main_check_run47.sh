#!/usr/bin/env bash
# Run 47's device calls. Library A is main's. B is main with benchmarks/reg_epilogue16_run46.diff (the linear epilogue
# stored from registers in 16-byte runs gathered by quad shuffles; .build/b46v4). C is main with
# benchmarks/swiglu_fwd_wide_run47.diff (the fused gate/up + SwiGLU epilogue's p, q and a stored in 16-byte runs
# gathered the same way, in place of 8- and 4-byte column pairs). D is main with
# benchmarks/swiglu_fwd_staged_run47.diff (that epilogue, in the ping-pong tiles, staged in shared memory and stored
# by TMA through one ragged tensor map per output and segment). Steps, each logged under $OUT, each given what is
# left of BUDGET_S (seconds, default 560):
#   tiles  with A: tests/gpu/test_fast_tiles.py ($OUT/tiles_A.log);
#   bits   benchmarks/variant_bits.py under A by the rule, and under each of BITS_LIBS (default "C D") by the rule
#          and in variants 0 and 3, each compared bit for bit with A by the rule ($OUT/bits.log);
#   fused  with FUSED_LIB (default D): tests/gpu/test_fast_fused_fwd.py and tests/gpu/test_fast_tiles.py
#          ($OUT/fused_$FUSED_LIB.log);
#   ab     whole steps (energy_probe.py) of AB_WORKLOADS, libraries AB_LIBS (default "A C D") in turn, AB_ROUNDS
#          rounds (default 2) ($OUT/energy_ab.log);
#   gpu    with FUSED_LIB: every GPU test (tests/gpu) ($OUT/gpu_tests.log).
# Printing step for the CPU checks (tests/test_device_scripts.py): ab-workloads.
# Usage (repo root, the libraries carried; B, C and D built here: git apply the diff, MOK_FAST_JOBS=2 python -m
# mok.fast._build OUT.so, git apply -R it):
#   MOK_FAST_LIB_A=$PWD/.build/b41gs/libmok_fast.so MOK_FAST_LIB_C=$PWD/.build/b47f/libmok_fast.so \
#     MOK_FAST_LIB_D=$PWD/.build/b47s/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run47.sh bits ab fused
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
AB_WORKLOADS="mok:qwen3-30b-a3b mok:olmoe-1b-7b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
source "$(dirname "$0")/device_budget.sh"
for step in "$@"; do
  case $step in
    tiles) echo "== tiles ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
           MOK_FAST_LIB=$(lib A) timeout "$(cap 150)" python -m pytest tests/gpu/test_fast_tiles.py -q \
             -p no:cacheprovider 2>&1 | tee "$OUT/tiles_A.log" | tail -3;;
    bits) echo "== bits ($(left) s left)"
          MOK_FAST_LIB=$(lib A) timeout "$(cap 60)" python benchmarks/variant_bits.py --save /tmp/bits_A_vrule.pt \
            2>&1 | grep -v -i warn
          for l in ${BITS_LIBS:-C D}; do for v in "" 0 3; do
            MOK_FAST_LIB=$(lib $l) MOK_FAST_GEMM_VARIANT=$v timeout "$(cap 60)" python benchmarks/variant_bits.py \
              --save "/tmp/bits_${l}_v${v:-rule}.pt" 2>&1 | grep -v -i warn
          done; done
          python benchmarks/variant_bits.py --compare /tmp/bits_A_vrule.pt \
            $(for l in ${BITS_LIBS:-C D}; do echo /tmp/bits_${l}_v{rule,0,3}.pt; done) 2>&1 | tee "$OUT/bits.log" \
            | tail -12;;
    fused) echo "== fused ($(left) s left)"
           MOK_FAST_LIB=$(lib "${FUSED_LIB:-D}") timeout "$(cap 200)" python -m pytest \
             tests/gpu/test_fast_fused_fwd.py tests/gpu/test_fast_tiles.py -q -p no:cacheprovider 2>&1 \
             | tee "$OUT/fused_${FUSED_LIB:-D}.log" | tail -3;;
    ab) echo "== ab ($(left) s left)"
        for r in $(seq 1 "${AB_ROUNDS:-2}"); do for l in ${AB_LIBS:-A C D}; do ab_round "$r" "$l"; done; done;;
    gpu) echo "== gpu ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
         MOK_FAST_LIB=$(lib "${FUSED_LIB:-D}") timeout "$(cap 300)" python -m pytest tests/gpu -q \
           -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -4;;
    ab-workloads) echo $AB_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in ab-workloads) ;; *) date -u;; esac
done
