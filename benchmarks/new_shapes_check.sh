#!/usr/bin/env bash
# Run 22's device call on main (one call under the 10-minute limit, the most needed step first):
# 1. the public-shape suite against the grouped_mm path, its three shapes added in run 21 (Phi-3.5-MoE,
#    Granite-3.0-3B-A800M, GLM-4.5-Air) never run on a GPU before;
# 2. the GPU tests and `mok verify --device cuda` on this tree;
# 3. with the time left, the tile rule on the three new shapes at steady state (energy_probe, two rounds): the rule
#    against the other side of its I <= 1024 split of that day (GLM-4.5-Air's I = 1408 is the closest to it in the suite), and
#    the fused SwiGLU backward forced off / on;
# 4. mok.MoE against a plain PyTorch module on the three new shapes.
# Usage (repo root, a library built from this tree): MOK_FAST_LIB=.build/main/libmok_fast.so bash benchmarks/new_shapes_check.sh
# `next`: the follow-up run 22 had no device time left for (about 6 minutes): the rule's ping-pong tile up to
# I = 1536 against the cooperative one on mid-64e without its shared expert (the shape) and GLM-4.5-Air, the
# DeepSeek-V3 slice (I = 2048, just past the line) the other way round, three rounds; then the per-stage profile of
# the three new shapes (profile_fast.py, one process each).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
END=$((SECONDS + ${BUDGET_S:-570}))
left() { echo $((END - SECONDS)); }
SMALL=+MOK_FAST_GEMM_VARIANT=3,3,3,3,,,3,3,0; LARGE=+MOK_FAST_GEMM_VARIANT=0,0,0,0,,,3,3,0
FUSE0=+MOK_FAST_FUSE_SWIGLU_BWD=0; FUSE1=+MOK_FAST_FUSE_SWIGLU_BWD=1
W="matmul mok:glm-4.5-air mok:glm-4.5-air$SMALL mok:glm-4.5-air$FUSE0 mok:phi-3.5-moe mok:phi-3.5-moe$SMALL"
W="$W mok:phi-3.5-moe$FUSE0 mok:granite-3.0-3b-a800m mok:granite-3.0-3b-a800m$LARGE mok:granite-3.0-3b-a800m$FUSE1"
N="matmul mok:mid-64e@S0 mok:mid-64e@S0$LARGE mok:glm-4.5-air mok:glm-4.5-air$LARGE mok:dsv3-ep8-slice@S0"
N="$N mok:dsv3-ep8-slice@S0$SMALL"
case ${1:-all} in
  workloads) echo $W; exit 0;;  # the energy step's list, for a CPU check that each parses (tests/test_device_scripts.py)
  next-workloads) echo $N; exit 0;;
  next) timeout 300 python benchmarks/energy_probe.py $N --rounds 3 --seconds 3 --cool 1.5 2>&1 \
          | tee "$OUT/energy_next.log" | tail -10
        for cfg in glm-4.5-air phi-3.5-moe granite-3.0-3b-a800m; do
          [ "$(left)" -gt 60 ] && timeout 90 python benchmarks/profile_fast.py $cfg 2>&1 | grep -v -i warn
        done > "$OUT/profile_new_shapes.log" 2>&1; tail -40 "$OUT/profile_new_shapes.log"; exit 0;;
  all) ;;
  *) echo "unknown step $1"; exit 2;;
esac
date -u; git log --oneline -1 2>/dev/null
timeout 280 python benchmarks/bench_moe.py --suite --weight-grads bf16 2>&1 | grep -v -i warn | tee "$OUT/suite.log" | tail -45
date -u
timeout 230 python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
timeout 40 python -m mok.harness.cli verify --device cuda 2>&1 | tee "$OUT/verify.log" | tail -2
date -u; echo "seconds left: $(left)"
[ "$(left)" -gt 60 ] && timeout $(($(left) - 45)) python benchmarks/energy_probe.py $W --rounds 2 --seconds 3 \
  --cool 1.5 2>&1 | tee "$OUT/energy.log" | tail -14
date -u; echo "seconds left: $(left)"
[ "$(left)" -gt 30 ] && timeout $(($(left) - 5)) python benchmarks/bench_moe.py --module --suite \
  --configs glm-4.5-air,phi-3.5-moe,granite-3.0-3b-a800m 2>&1 | grep -v -i warn | tee "$OUT/module.log" | tail -12
date -u
