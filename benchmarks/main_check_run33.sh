#!/usr/bin/env bash
# Run 33's device calls. Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   gu-tiles  the fused gate/up + SwiGLU launch of the few-large-expert shapes in the cooperative 128x256 tile
#             (variant 0) against the rule's ping-pong 128x192 (variant 3): whole steps, interleaved in one process
#             (energy_probe.py GU_WORKLOADS, two rounds, the second in reverse order). Run 31 timed Llama-4-Scout's
#             fused forward alone at 7.11 ms in the cooperative tile against 7.99 (an H100). GU_SECONDS (3) and GU_COOL
#             (1.5) set energy_probe.py's --seconds and --cool. Since run 34 the rule itself runs these shapes'
#             fused launch cooperative, so both workloads of a pair are the same: main_check_run34.sh preset-ab
#             compares with the old rule.
#   gather-mma  benchmarks/gather_producer_probe.cu with its wgmma consumer (the ping-pong tile's mainloop, no
#             epilogue): A by one TMA, or gathered by 1, 2 or 4 producer warps' cp.async (and 4 warps contiguous),
#             B by TMA, on Qwen3-30B-A3B's and mid-64e's gate/up shapes; then the spin consumer's 4-warp gather for
#             comparison with run 14. $PROBE: the probe built on the CPU box (default .build/probe/gather_probe;
#             the build line is in the probe's header), carried.
# Printing step for the CPU check (tests/test_device_scripts.py): `gu-workloads`.
# Issue 13's preset on an H200 is main_check_run31.sh's h200 step.
# Usage (repo root, a library built from this tree, carried):
#   MOK_FAST_LIB=$PWD/.build/b32/libmok_fast.so bash benchmarks/main_check_run33.sh gu-tiles
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PROBE=${PROBE:-.build/probe/gather_probe}
# GEMM_TN_SWIGLU_FWD (the eighth kind) in variant 0, every other kind as the rule says
COOP=MOK_FAST_GEMM_VARIANT=,,,,,,,0,
GU_WORKLOADS=""
for shape in llama-4-scout dbrx phi-3.5-moe mixtral-8x7b; do GU_WORKLOADS+="mok:$shape mok:$shape+$COOP "; done
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
for step in "$@"; do
  case $step in
    gu-workloads) echo $GU_WORKLOADS;;
    gu-tiles) echo "== gu-tiles ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
              timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $GU_WORKLOADS --rounds 2 \
                --seconds ${GU_SECONDS:-3} --cool ${GU_COOL:-1.5} 2>&1 | grep -v -i warn \
                | tee "$OUT/energy_gu_tiles.log" | tail -12;;
    gather-mma) echo "== gather-mma ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
                for shape in "--tokens 16384 --hidden 2048 --topk 8 --n-tiles 8" \
                             "--tokens 8192 --hidden 4096 --topk 6 --n-tiles 16"; do
                  for mode in "--mode tma" "--mode cpasync --warps 1" "--mode cpasync --warps 2" \
                              "--mode cpasync --warps 4" "--mode cpasync --warps 4 --contiguous"; do
                    timeout 30 "$PROBE" $mode $shape --consumer wgmma
                  done
                  timeout 30 "$PROBE" --mode cpasync --warps 4 $shape
                done 2>&1 | tee "$OUT/gather_mma.log";;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in gu-tiles|gather-mma) date -u;; esac
done
