// Shared memory of the row-tiled grouped GEMMs (gate/up + SwiGLU, down, d_a + SwiGLU backward, d_x) in each tile
// variant of csrc/grouped_gemm.cuh, read from the instantiated CUTLASS types: the mainloop's stages, a stage's
// bytes (A tile + B tile), the epilogue's shared storage, the kernel's total; and the stages that would be left
// if every stage also held a second B tile (a tile whose two 64-row halves belong to two experts, each half
// multiplying its own expert's B: the "paired tails" tile of docs/fast_path.md). Host only: nothing runs on a GPU.
//
// Build and run (repo root, nvcc and the CUTLASS headers of `pip install nvidia-cutlass`):
//   nvcc $(python -c "from mok.fast import _build; print(' '.join(_build.compile_flags()))") \
//     -o /tmp/smem_stages benchmarks/smem_stages.cu && /tmp/smem_stages
#include <cstdio>

#include "grouped_gemm.cuh"

namespace {

using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;
using bf16 = cutlass::bfloat16_t;

template <class LA, class LB, class ED, int V, mok::Epi kEpi, bool kKHalves>
void show(const char* kind) {
  using Variant = mok::VariantOf<LA, LB, ED, V, kEpi, kKHalves>;
  using G = typename Variant::type;
  using Mainloop = typename G::CollectiveMainloop;
  using Tile = typename Variant::Tile;
  constexpr int stages = Mainloop::DispatchPolicy::Stages;
  constexpr size_t stage_bytes = sizeof(typename Mainloop::SharedStorage::TensorStorage) / stages;
  constexpr size_t b_tile_bytes = size_t(cute::size<1>(Tile{})) * cute::size<2>(Tile{}) * sizeof(bf16);
  constexpr size_t kernel = sizeof(typename G::GemmKernel::SharedStorage);
  constexpr size_t capacity = cutlass::gemm::collective::detail::sm90_smem_capacity_bytes;
  constexpr size_t rest = kernel - stages * stage_bytes;  // epilogue, barriers, tensormaps
  const long paired = long(capacity - rest) / long(stage_bytes + b_tile_bytes);
  std::printf("| %s | %d | %dx%d | %d | %zu | %zu | %zu | %ld |\n", kind, V, int(cute::size<0>(Tile{})),
              int(cute::size<1>(Tile{})), stages, stage_bytes, sizeof(typename G::CollectiveEpilogue::SharedStorage),
              kernel, paired);
}

template <class LA, class LB, class ED, mok::Epi kEpi, bool kKHalves = false>
void kind(const char* name) {
  show<LA, LB, ED, 0, kEpi, kKHalves>(name);
  show<LA, LB, ED, 1, kEpi, kKHalves>(name);
  show<LA, LB, ED, 2, kEpi, kKHalves>(name);
  show<LA, LB, ED, 3, kEpi, kKHalves>(name);
}

}  // namespace

int main() {
  std::printf("shared memory capacity %zu bytes\n\n", size_t(cutlass::gemm::collective::detail::sm90_smem_capacity_bytes));
  std::printf("| kind | variant | tile | stages | bytes a stage | epilogue bytes | kernel bytes | stages with a "
              "second B tile |\n|---|---|---|---|---|---|---|---|\n");
  kind<RowMajor, ColMajor, float, mok::Epi::kSwigluFwd>("gate/up + SwiGLU (TN_SWIGLU_FWD)");
  kind<RowMajor, ColMajor, bf16, mok::Epi::kLinear>("down (TN_BF16)");
  kind<RowMajor, RowMajor, bf16, mok::Epi::kSwigluBwd>("d_a + SwiGLU backward (NN_SWIGLU_BWD)");
  kind<RowMajor, RowMajor, bf16, mok::Epi::kLinear, true>("d_x (NN_BF16, K halves)");
  return 0;
}
