#!/usr/bin/env bash
# Run 45's device calls. Library A is main's; library B is main with benchmarks/chunked_order_run45.diff
# (MOK_FAST_GEMM_CHUNK=c: each persistent CTA, or cluster, takes c neighbouring tiles in a row, so it changes group,
# and CUTLASS rewrites its tensor maps, up to c times less often; unset or 1: CUTLASS's order, the same kernels as A
# otherwise). Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   groups  benchmarks/bench_group_changes.py on GROUP_CONFIGS in tile variants 0 and 5 with library A: one
#           down-projection launch over the same rows as E routed experts, E even ones, E/8 even ones and one group,
#           so that "E even" against "E/8 even" says what the per-group tensor-map rewrites cost ($OUT/groups.log);
#   apply   apply the diff to this copy of the tree (its GPU tests; the library is B, built on the CPU box);
#   chunk-tests  with B: tests/gpu/test_fast_tiles.py (every variant under chunks 2, 3 and 16 gives chunk 1's bits;
#           bad chunks are errors naming the variable);
#   chunk   with B: the same benchmark under chunks 1, 2 and 4, bits checked equal across chunks ($OUT/chunk.log);
#   ab      whole steps (energy_probe.py) of AB_WORKLOADS, each by the rule and with chunk 2 and 4, library B,
#           two rounds in one process each ($OUT/energy_chunk.log).
# Printing steps for the CPU checks (tests/test_device_scripts.py): groups-configs, ab-workloads.
# Usage (repo root, the libraries carried; B built here: git apply the diff, MOK_FAST_JOBS=2 python -m
# mok.fast._build OUT.so, git apply -R it):
#   MOK_FAST_LIB_A=$PWD/.build/b41gs/libmok_fast.so BUDGET_S=200 bash benchmarks/main_check_run45.sh groups
#   MOK_FAST_LIB_B=$PWD/.build/b45ch/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run45.sh apply \
#     chunk-tests chunk ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GROUP_CONFIGS=qwen3-30b-a3b,olmoe-1b-7b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
AB_WORKLOADS="mok:qwen3-30b-a3b mok:qwen3-30b-a3b+MOK_FAST_GEMM_CHUNK=2 mok:qwen3-30b-a3b+MOK_FAST_GEMM_CHUNK=4
              mok:olmoe-1b-7b mok:olmoe-1b-7b+MOK_FAST_GEMM_CHUNK=2 mok:olmoe-1b-7b+MOK_FAST_GEMM_CHUNK=4
              mok:mid-64e@S0 mok:mid-64e@S0+MOK_FAST_GEMM_CHUNK=2 mok:mid-64e@S0+MOK_FAST_GEMM_CHUNK=4
              mok:dsv3-ep8-slice@S0 mok:dsv3-ep8-slice@S0+MOK_FAST_GEMM_CHUNK=2"
source "$(dirname "$0")/device_budget.sh"
for step in "$@"; do
  case $step in
    groups) echo "== groups ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
            MOK_FAST_LIB=$MOK_FAST_LIB_A timeout "$(cap 240)" python benchmarks/bench_group_changes.py \
              --configs "$GROUP_CONFIGS" --variants 0,5 --rounds 3 2>&1 | tee "$OUT/groups.log";;
    apply) git apply --check -R benchmarks/chunked_order_run45.diff 2>/dev/null && echo "== apply: already applied" \
             || { git apply benchmarks/chunked_order_run45.diff && echo "== apply: applied"; } || exit 1;;
    chunk-tests) echo "== chunk-tests ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
                 MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap 150)" python -m pytest -q -p no:cacheprovider \
                   tests/gpu/test_fast_tiles.py 2>&1 | tee "$OUT/gpu_tiles_chunk.log" | tail -4;;
    chunk) echo "== chunk ($(left) s left)"
           MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap 240)" python benchmarks/bench_group_changes.py \
             --configs "$GROUP_CONFIGS" --variants 0,5 --chunks 1,2,4 --rounds 2 2>&1 | tee "$OUT/chunk.log";;
    ab) echo "== ab ($(left) s left)"
        MOK_FAST_LIB=$MOK_FAST_LIB_B energy energy_chunk.log 16 200 $AB_WORKLOADS --rounds 2;;
    groups-configs) echo $GROUP_CONFIGS;;
    ab-workloads) echo $AB_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in groups-configs|ab-workloads) ;; *) date -u;; esac
done
