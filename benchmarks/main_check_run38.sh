#!/usr/bin/env bash
# Run 38's last device call. Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   settle   on an H200 only: issue 13's preset, three interleaved rounds (energy_probe.py --preset issue13 --rounds 3):
#            whether Qwen3-30B-A3B's 70% of the peak holds; run 38's first two calls put it on either side (6.49 and
#            6.70 ms burst on one warm machine);
#   da-coop  on an H200 only: whole steps (energy_probe.py, two interleaved rounds) of issue 13's four shapes and
#            OLMoE-1B-7B with the fused d_a GEMM by the rule (ping-pong 128x192, the loaded epilogue) and forced to the
#            cooperative 128x256 tile: run 37's coop-da-steps over DA_COOP_SHAPES. On an H100 that tile was 1.4-7%
#            slower (runs 34 and 37); on an H200, whose memory is 1.4x as fast, the fused gate/up kind's choice went
#            the other way (run 35).
# Printing step for the CPU check (tests/test_device_scripts.py): da-coop-workloads.
# Usage (repo root, a build of main carried):
#   MOK_FAST_LIB=$PWD/.build/b36main/libmok_fast.so BUDGET_S=400 bash benchmarks/main_check_run38.sh settle da-coop
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export COOP_DA_SHAPES="qwen3-30b-a3b mid-64e@S0 dsv3-ep8-slice@S0 mixtral-8x7b olmoe-1b-7b"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
for step in "$@"; do
  case $step in
    settle) h200 || { echo "settle: not an H200"; exit 3; }
            echo "== settle ($(left) s left)"
            timeout $(( $(left) < 200 ? $(left) : 200 )) python benchmarks/energy_probe.py --preset issue13 --rounds 3 \
              --seconds 3 --cool 1.5 2>&1 | grep -v -i warn | tee "$OUT/energy_preset3.log" | tail -16;;
    da-coop) h200 || { echo "da-coop: not an H200"; exit 3; }
             echo "== da-coop ($(left) s left)"
             BUDGET_S=$(left) bash benchmarks/main_check_run37.sh coop-da-steps;;
    da-coop-workloads) bash "$(dirname "$0")/main_check_run37.sh" coop-da-workloads;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in settle|da-coop) date -u;; esac
done
