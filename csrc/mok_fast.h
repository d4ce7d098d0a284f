// mok fast path: C ABI shared by the kernels (csrc/*.cu, built into the kernels library) and the typed binding
// (csrc/python_api.cpp, which resolves every entry point below by name from that library, RTLD_LOCAL). The kernels
// trust their arguments: the binding checks every tensor (dtype, device, shape, contiguity) and takes the device
// guard and the current stream before each call. Shapes follow the legend of docs/layer.md: T tokens, H hidden, I
// routed intermediate, S shared intermediate, E experts, L = E / W local experts, K experts per token. Rows are
// (token, k) pairs placed in canonical order: by expert, then token index, then k.
#pragma once
#include <cstddef>
#include <cstdint>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
// The binding builds without the CUDA headers: the stream is an opaque handle (CUDA's own host-compiler typedef, so
// including cuda_runtime.h as well is fine).
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
#endif

// The library is compiled with -fvisibility=hidden and linked with csrc/exports.map: these entry points are the only
// symbols it exports (no C++ standard library or CUDA runtime symbol can interpose on the rest of the process).
#define MOK_API __attribute__((visibility("default")))

#define MOK_MAX_SEGMENTS 4
#define MOK_ROUTER_MAX_E 8192
// Tile variants of every grouped-GEMM kind (csrc/grouped_gemm.cuh): 0 cooperative 128x256x64, 1 the same
// in 2x1 clusters, 2 ping-pong 128x192x64 in 2x1 clusters, 3 ping-pong 128x192x64, 4 ping-pong 192x128x64 in 1x2
// clusters for the weight-gradient kinds (variant 3 for the others), 5 cooperative 256x128x64 in 1x2 clusters for the
// plain bf16-out row-tiled kinds (variant 0 for the others). Same bits for all.
#define MOK_GEMM_NUM_VARIANTS 6
// MOK_GEMM_FP8_TN_SWIGLU_FWD's B, the interleaved [gate; up] (mok/fast/_fp8.py GateUp): rows in groups of
// MOK_FP8_SWIGLU_GROUP, gate's then the same up rows, one sfb row per group; mok_fp8_swiglu_rows(I) is its rows for I
// intermediate columns (gate and up each padded with zero rows to whole groups).
#define MOK_FP8_SWIGLU_GROUP 64
#ifdef __CUDACC__
#define MOK_HOST_DEVICE __host__ __device__
#else
#define MOK_HOST_DEVICE
#endif
static inline MOK_HOST_DEVICE int64_t mok_fp8_swiglu_rows(int64_t I) {
  return 2 * ((I + MOK_FP8_SWIGLU_GROUP - 1) / MOK_FP8_SWIGLU_GROUP) * MOK_FP8_SWIGLU_GROUP;
}

// One operand of a grouped GEMM. For group g (expert e = g - expert_base, or the shared expert):
//   pointer = base + offset + e * expert_stride + row_offset(e) * row_stride   (in elements)
// and ld is the leading dimension (elements) of the matrix as stored.
struct MokOperand {
  void* base;
  int64_t offset;
  int64_t expert_stride;
  int64_t row_stride;
  int64_t ld;
};

// A run of groups sharing one formula. rows(e) = offsets[e + 1] - offsets[e] when offsets is non-null, else fixed_rows.
// rows_dim says which of M (0) or K (2) is rows(e); the other two are the constants m, n, k. Groups whose rows are 0
// get M = 0 (no tiles). aux: the extra operand of a fused epilogue (MOK_GEMM_NN_SWIGLU_BWD's fp32 [p | q] input,
// MOK_GEMM_TN_SWIGLU_FWD's and MOK_GEMM_FP8_TN_SWIGLU_FWD's bf16 a output); base null for every other kind. b_up: B's
// second half as another tensor, with b's ld, expert_stride and row_stride, each group's lying a whole number of 16
// bytes, nonzero and under 2^40, from its b: for MOK_GEMM_TN_SWIGLU_FWD the up rows of B [n, k] (b then holds the n / 2
// gate rows; base null: the up rows are the n / 2 rows that follow the gate rows in b, one [gate; up] tensor); for
// MOK_GEMM_NN_BF16 (d_x) K rows [k/2, k) of B [k, n] (b holds rows [0, k/2); k a multiple of 128, rows as M; base null:
// B is b alone). Base null for every other kind.
struct MokSegment {
  int num_groups;
  int rows_dim;
  int fixed_rows;
  int m, n, k;
  const int* offsets;  // device, [num_groups + 1] int32, or nullptr
  MokOperand a, b, d, aux, b_up;
  // The FP8 kinds' block scales (base null for every other kind), fp32 powers of two, K-major as the FP8 recipe's
  // quantiser gives them (docs/numerics.md): sfa of A [rows, ceil(k/128)] row-major (one per row and 128 columns of
  // K: ld = ceil(k/128)), sfb of B [ceil(n/128), ceil(k/128)] row-major (one per 128x128 block of B [n, k]; for
  // MOK_GEMM_FP8_TN_SWIGLU_FWD one per 64 rows and 128 columns of its interleaved B).
  MokOperand sfa, sfb;
};

enum MokGemmKind {
  MOK_GEMM_TN_F32 = 0,   // A row-major [M,K], B [N,K] row-major (K-major), D fp32 row-major
  MOK_GEMM_TN_BF16 = 1,  // same, D bf16
  MOK_GEMM_NN_F32 = 2,   // A row-major [M,K], B [K,N] row-major (N-major), D fp32
  MOK_GEMM_NN_BF16 = 3,  // same, D bf16; B [K,N] may be two tensors (b_up: K rows [K/2, K))
  MOK_GEMM_TT_F32 = 4,   // A [K,M] row-major (M-major), B [K,N] row-major (N-major), D fp32 (weight grads)
  MOK_GEMM_TT_BF16 = 5,  // same, D bf16 (weight grads of bf16 parameters)
  MOK_GEMM_NN_SWIGLU_BWD = 6,  // NN, and the epilogue turns the fp32 product da [M,N] into D bf16 [M,2N] =
                               // [dg | du] = [bf16(da * p) | bf16(da * q)], reading aux fp32 [M,2N] = [p | q]
  MOK_GEMM_TN_SWIGLU_FWD = 7,  // TN with B [N,K] = [W_gate; W_up] (one tensor, or W_gate in b and W_up in b_up;
                               // N a multiple of 16) giving [g | u]: D fp32 [M,N] = [p | q] =
                               // [u * silu'(g) | silu(g)] (swiglu_math.cuh), and aux bf16 [M,N/2] =
                               // a = bf16(silu(g) * u), written
  MOK_GEMM_TT_F32_SMALL = 8,   // TT_F32 in a ping-pong 64x128x64 tile whatever the variant: the router's weight
                               // gradient ([E, H] outputs over T-long reductions: more output tiles, more SMs)
  MOK_GEMM_FP8_TN_F32 = 9,     // TN on e4m3 operands with block scales (segment operands sfa, sfb): A [M,K] row-major,
                               // B [N,K] row-major, D fp32 = sum over K blocks of 128 of (A_blk B_blk) * sfa * sfb;
                               // K a multiple of 128 (the quantisers pad with zeros); one tile, whatever the variant
  MOK_GEMM_FP8_TN_BF16 = 10,   // same, D bf16
  MOK_GEMM_FP8_TN_SWIGLU_FWD = 11,  // FP8 TN fused with the SwiGLU forward (MOK_GEMM_TN_SWIGLU_FWD's outputs): n = 2I
                               // (I a multiple of 8), B [2 * ceil(I/64) * 64, K] the interleaved [gate; up] (rows in
                               // groups of 64: gate rows 64j.. then up rows 64j..; zero rows pad I), sfb per 64 rows
                               // and 128 columns [2 * ceil(I/64), K/128]; D fp32 [M, 2I] = [p | q], aux bf16 [M, I] = a
  MOK_GEMM_NUM_KINDS = 12
};

extern "C" {
// Bytes of device memory the grouped GEMM of this kind and tile variant needs for `groups` groups: the
// CUTLASS workspace plus the per-group argument arrays (0 for an unknown kind or variant). Host only.
MOK_API size_t mok_gemm_workspace_bytes(int kind, int variant, int groups, int device);
// Grouped GEMM D_g = A_g B_g (fp32 accumulation, one rounding to D's type), groups described by
// `segs` (host array of n_segs), with tile variant `variant` in [0, MOK_GEMM_NUM_VARIANTS).
// workspace: mok_gemm_workspace_bytes bytes of device memory.
// Returns 0 on success, else a nonzero code (see mok_last_error).
MOK_API int mok_grouped_gemm(int kind, int variant, const MokSegment* segs, int n_segs, void* workspace,
                     size_t workspace_bytes, int device, cudaStream_t stream);
MOK_API const char* mok_last_error();

// Routing schedule (csrc/schedule.cu). topk_idx [T,K] int64 global ids, local experts [e0, e0+L).
// offsets: int32 [2L+1]: [0, L] first row of each expert clamped to capacity (offsets[L] = rows
// placed), [L+1, 2L] rows per expert; row_pair [capacity] int32: pair index t*K+k of each row;
// pair_row [T*K] int32: row of each pair (-1 if its expert is not local or it did not fit);
// flag int32 [1]: nonzero when an id is out of [0, E) (bit 1), repeated within a row (bit 2), or
// rows exceed capacity (bit 4); scratch: mok_schedule_scratch_ints(T, K, L) int32.
MOK_API size_t mok_schedule_scratch_ints(int T, int K, int L);
MOK_API int mok_schedule(const int64_t* topk_idx, int T, int K, int E, int e0, int L, int capacity,
                 int* offsets, int* row_pair, int* pair_row, int* flag, int* scratch,
                 cudaStream_t stream);

// Elementwise / gather / combine kernels (csrc/elementwise.cu); all bf16 = uint16 storage.
// x_RH [capacity, H] row pair_row[t*K + k] = x_TH [T, H] row t, for every pair placed (pair_row >= 0).
MOK_API int mok_gather_rows(const void* x_TH, const int* pair_row, int T, int K, int H, int capacity, void* x_RH,
                    cudaStream_t stream);
// SwiGLU rows: offsets[L] of the schedule's offsets (rows placed) when offsets is non-null, else
// fixed_rows; the grid covers `capacity` rows. swiglu_fwd reads gu = [g | u] fp32, writes a = bf16(silu(g) * u)
// and turns gu into [p | q] = [u * silu'(g) | silu(g)] in place; swiglu_bwd reads that [p | q] and da fp32 and
// writes dgu = [bf16(da * p) | bf16(da * q)] (csrc/swiglu_math.cuh).
MOK_API int mok_swiglu_fwd(float* gu, int64_t ld_gu, const int* offsets, int L, int fixed_rows, int I,
                   int capacity, void* a, cudaStream_t stream);
MOK_API int mok_combine_fwd(const void* s_TH, const void* o_RH, const float* w_TK, const int* pair_row,
                    const int* flag, int T, int K, int H, void* y_TH, cudaStream_t stream);
MOK_API int mok_combine_bwd_pre(const void* dy_TH, const void* o_RH, const float* w_TK,
                        const int* pair_row, const int* flag, int T, int K, int H,
                        float* d_w_TK, void* go_RH, cudaStream_t stream);
MOK_API int mok_swiglu_bwd(const float* da, const float* pq, int64_t ld_pq, const int* offsets, int L,
                   int fixed_rows, int I, int capacity, void* dgu, cudaStream_t stream);
MOK_API int mok_combine_bwd_dx(const void* dxs_TH, const void* dx_RH, const int* pair_row,
                       const int* flag, int T, int K, int H, void* dx_TH, cudaStream_t stream);
// Zero d[e] for every expert e with no rows; d holds L blocks of per_expert 16-bit words (any dtype
// whose zero is all-zero bits: fp32 blocks count 2 words per element).
MOK_API int mok_zero_empty(void* d, const int* offsets, int L, int64_t per_expert, const int* flag,
                   cudaStream_t stream);
MOK_API int mok_poison(void* p, int64_t n, int is_bf16, const int* flag, cudaStream_t stream);
// out (bf16, [blocks, 2, n]) = first, second (fp32, [blocks, n] each) rounded to bf16: a float32 gate/up
// pair into one stacked tensor (16-byte vectors when n % 8 == 0 and the pointers are 16-byte aligned).
MOK_API int mok_cast_pair_bf16(const float* first, const float* second, int64_t blocks, int64_t n, void* out,
                       cudaStream_t stream);

// FP8 recipe quantisers (csrc/fp8_quant.cu, docs/numerics.md "FP8 recipe"), bit for bit mok.reference's: e4m3 values
// (uint8 storage) and power-of-two fp32 scales from amax's bf16 bits.
// Activations: row r of x (bf16, leading dimension ld_x) holds `parts` parts of P columns (part j from column j * P),
// each quantised in 1x128 blocks from its first column: q [rows, parts * Pp] e4m3 with part j's values in columns
// [j * Pp, j * Pp + P) and zeros in the rest of its Pp = ceil(P/128) * 128; scales [rows, parts * ceil(P/128)]
// fp32, part j's blocks from column j * ceil(P/128). count: device int32 or null; rows quantised = min(*count, rows).
MOK_API int mok_fp8_quant_rows(const void* x, int64_t ld_x, int rows, int parts, int P, const int* count, void* q,
                               float* scales, cudaStream_t stream);
// Weights: w [L, N, K] bf16 in 128x128 blocks. q [L, N, Kp] e4m3 (Kp = ceil(K/128) * 128, zeros past K) and
// s [L, ceil(N/128), ceil(K/128)] fp32, each skipped when null; the transpose's quantisation (the same values and
// scales, transposed) into qT (row k of expert l at qT + l * K * ld_qT + k * ld_qT + off_qT: columns [0, Np) with
// zeros past N, Np = ceil(N/128) * 128) and sT (row kb of expert l at sT + (l * ceil(K/128) + kb) * ld_sT + off_sT:
// ceil(N/128) columns), each skipped when null.
MOK_API int mok_fp8_quant_blocks(const void* w, int L, int N, int K, void* q, float* s, void* qT, int64_t ld_qT,
                                 int64_t off_qT, float* sT, int64_t ld_sT, int64_t off_sT, cudaStream_t stream);

// Router (csrc/router.cu), one warp per token, the reference's formulas and orders.
// logits [T, ld] fp32 (first E columns used); softmax: 1 = softmax scores, 0 = sigmoid;
// scores [T, E] fp32, topk_idx [T, K] int64, topk_w [T, K] fp32.
MOK_API int mok_router_topk(const float* logits, int T, int E, int ld, int K, int softmax, int normalize,
                    float* scores, int64_t* topk_idx, float* topk_w, cudaStream_t stream);
// d_logits of (topk_w, scores) + d_logits_in, as bf16 hi | lo halves: hl [T, 2 * ld_half] bf16,
// hi in columns [0, E), lo in [ld_half, ld_half + E), zeros in the padding. d_w [T, K],
// d_scores and d_logits_in [T, E] fp32; each may be null (zeros).
MOK_API int mok_router_bwd(const float* scores, const int64_t* topk_idx, const float* d_w, const float* d_scores,
                   const float* d_logits, int T, int E, int K, int softmax, int normalize, int ld_half,
                   void* hl, cudaStream_t stream);

// Router losses (csrc/router_losses.cu), deterministic, fp32: scores, logits [T, E], topk_idx [T, K] int64;
// normalize_rows: 1 = sigmoid scores (the balance loss divides each row by its sum). scratch:
// mok_router_losses_scratch_bytes(T, E) bytes of device memory. Forward: balance [1] = E * sum_e f_e * P_e and
// z [1] = mean of lse^2. Backward: d_scores, d_logits [T, E] from the device scalars d_balance, d_z [1].
MOK_API size_t mok_router_losses_scratch_bytes(int T, int E);
MOK_API int mok_router_losses(const float* scores, const float* logits, const int64_t* topk_idx, int T, int E, int K,
                      int normalize_rows, void* scratch, float* balance, float* z, cudaStream_t stream);
MOK_API int mok_router_losses_bwd(const float* d_balance, const float* d_z, const float* scores, const float* logits,
                          const int64_t* topk_idx, int T, int E, int K, int normalize_rows, void* scratch,
                          float* d_scores, float* d_logits, cudaStream_t stream);

// Expert parallelism (csrc/ep.cu, docs/expert_parallel.md). peers / peer_flags: device arrays of W
// pointers, one per rank (this rank's own buffer included), into the ranks' peer-visible buffers.
// Gather: out[r] (bf16 [capacity, H]) = row (row_pair[r] / div) % per_rank of rank (row_pair[r] / div) /
// per_rank, for the rows placed (offsets[L]).
MOK_API int mok_ep_gather_rows(const void* const* peers, int W, int64_t per_rank, int div, const int* row_pair,
                       const int* offsets, int L, int H, int capacity, void* out, cudaStream_t stream);
// Scatter: row row_pair[r] % per_rank of rank row_pair[r] / per_rank = rows[r], for the rows placed.
MOK_API int mok_ep_scatter_rows(const void* rows, const int* row_pair, const int* offsets, int L, int H, int capacity,
                        int W, int64_t per_rank, void* const* peers, cudaStream_t stream);
// out = every rank's first bytes_per_rank bytes (a multiple of 8), concatenated in rank order.
MOK_API int mok_ep_concat(const void* const* peers, int W, int64_t bytes_per_rank, void* out, cudaStream_t stream);
// Let kernels on `device` read and write memory of `peer` (no-op when equal or already enabled).
MOK_API int mok_ep_enable_peer_access(int device, int peer);
// Signalling: *epoch += 1; flags of every rank p at [phase][rank] = *epoch; wait until this rank's
// flags[phase][p] >= *epoch for every p, or print and trap after timeout_ns (0: never).
MOK_API int mok_ep_next_epoch(int* epoch, cudaStream_t stream);
MOK_API int mok_ep_signal(int* const* peer_flags, int W, int phase, int rank, const int* epoch, cudaStream_t stream);
MOK_API int mok_ep_wait(const int* flags, int W, const int* epoch, int64_t timeout_ns, int rank, int phase,
                cudaStream_t stream);
}
