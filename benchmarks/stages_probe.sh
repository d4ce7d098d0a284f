#!/usr/bin/env bash
# Builds the PAIRED_STAGES probe library (benchmarks/RESULTS.md run 32): this tree's csrc with
# benchmarks/stages_probe.diff applied, so that the row-tiled grouped GEMMs (A row-major: gate/up + SwiGLU, down,
# d_a + SwiGLU backward, d_x) run their mainloops with the stages they would have if every stage also held a second B
# tile (a tile whose 64-row halves belong to two experts: docs/fast_path_measurements.md, "the experts' last tiles"). Same tiles,
# same bits, fewer stages: what the pipeline depth alone would cost the full tiles. The four translation units of those
# kinds are compiled with the library's flags and linked with the other objects of a build of this tree; the script
# first prints benchmarks/smem_stages.cu's table for the patched headers (its "stages" column is then the unpatched
# table's last column).
# Needs nvcc and the CUTLASS headers (pip install nvidia-cutlass). Usage, from the repo root:
#   MOK_FAST_JOBS=2 python -m mok.fast._build .build/main/libmok_fast.so      # -> .build/main/libmok_fast_obj/*.o
#   bash benchmarks/stages_probe.sh .build/main/libmok_fast_obj .build/stages  # -> .build/stages/libmok_fast.so
# Then on the GPU, one process per library: python benchmarks/profile_fast.py <configs> under each MOK_FAST_LIB.
set -euo pipefail
base_obj=$(realpath "$1"); out=$(realpath -m "$2"); repo=$PWD
src=$(mktemp -d); trap 'rm -rf "$src"' EXIT
cp -r "$repo/mok" "$src/"
(cd "$src" && git apply "$repo/benchmarks/stages_probe.diff")  # $src is no git work tree: the files are patched
flags=$(python -c "from mok.fast import _build; print(' '.join(f for f in _build.compile_flags() if f != '-I' + str(_build.CSRC)))")
mkdir -p "$out"
nvcc $flags -I"$src/mok/fast/csrc" -o "$src/smem_stages" benchmarks/smem_stages.cu && "$src/smem_stages"
tus="gemm_tn_swiglu_fwd gemm_tn_bf16 gemm_nn_swiglu_bwd gemm_nn_bf16"
others=$(ls "$base_obj"/*.o | grep -v -E "/($(echo $tus | tr ' ' '|'))\.o$")
for tu in $tus; do
  nvcc $flags -I"$src/mok/fast/csrc" -Xcompiler -fPIC -c "$src/mok/fast/csrc/$tu.cu" -o "$out/$tu.o" &
done
wait
nvcc -gencode=arch=compute_90a,code=sm_90a -shared -cudart static $others "$out"/gemm_*.o -o "$out/libmok_fast.so"
echo "$out/libmok_fast.so"
