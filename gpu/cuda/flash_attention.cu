// Fused causal attention, FlashAttention-2's schedule (Dao, 2023) on plain
// CUDA cores: no [T,T] matrix is ever stored. Forward: a block owns
// kQueryRows query rows of one (sequence, head) and walks the key tiles its
// rows may see, keeping each row's running maximum, denominator and output
// in registers (online softmax); it writes the output and each row's
// log-sum-exp. Backward recomputes the probabilities from q, k and lse, in
// two kernels so that every gradient element has exactly one writer (no
// atomics, deterministic): one owns a tile of keys and sums dK and dV over
// the query rows that see it, the other owns query rows and sums dQ over the
// keys they see. D[t] = dout[t] . out[t] (the softmax backward's row term)
// is computed first.
//
// Layout per block: 4 warps; a key tile is 32 keys, one per lane, so a
// lane scores one key against a row read from shared memory as a broadcast,
// and a warp owns whole rows. Head sizes up to kMaxFlashHeadSize; each lane
// holds head_size/32 output columns. K (and V where lanes read it by key) sit
// in shared memory with a row stride of head_size + 1, so lanes reading
// different keys hit different banks. Arithmetic is fp32 for every storage
// type; exp is expf (not the fast intrinsic) to stay within the tests'
// tolerance of the host op.
#include <cmath>
#include <string>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/element.cuh"
#include "gpu/cuda/ops.h"

namespace strata::gpu::cuda {
namespace {

using detail::add_to;
using detail::from_f;
using detail::launched;
using detail::to_f;
using detail::warp_max;
using detail::warp_sum;

constexpr int kWarps = 4;
constexpr int kFlashThreads = 32 * kWarps;
constexpr int kKeyTile = 32;                             // keys per tile: one per lane
constexpr int kQueryRows = 32;                           // forward: rows per block
constexpr int kBackRows = 16;                            // backward: rows per tile
constexpr int kSlots = kMaxFlashHeadSize / 32;           // head columns per lane
constexpr int kEntries = kKeyTile * kMaxFlashHeadSize / kFlashThreads;  // dK/dV elements per thread
static_assert(kQueryRows % kWarps == 0 && kBackRows % kWarps == 0 && kKeyTile % kBackRows == 0);

// Where one (sequence b, head h) lives in qkv [B,T,3C] and in [B,T,C] tensors.
struct Head {
  int64_t qkv;  // offset of q for row 0; k is + C, v is + 2C; row stride 3C
  int64_t row;  // offset of row 0 in out/dout; row stride C
  int64_t lse;  // offset of row 0 in lse/D [B,NH,T]
};

__device__ Head head_of(int64_t bh, int64_t seq, int64_t C, int NH, int hs) {
  const int64_t b = bh / NH, h = bh % NH;
  return {b * seq * 3 * C + h * hs, b * seq * C + h * hs, bh * seq};
}

// s[r * ld + d] = fp32 of rows [r0, r0 + rows) of one head's slice (row
// stride `stride`), zero for rows at or past seq.
template <class T>
__device__ void load_tile(float* s, int ld, const T* src, int64_t stride, int64_t r0, int rows, int64_t seq, int hs) {
  for (int e = threadIdx.x; e < rows * hs; e += blockDim.x) {
    const int r = e / hs, d = e % hs;
    const int64_t t = r0 + r;
    s[r * ld + d] = t < seq ? to_f(src[t * stride + d]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// grid (ceil(seq / kQueryRows), B * NH); smem Q [kQueryRows][hs], K [32][hs+1], V [32][hs].
template <class T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(T* out, float* lse, const T* qkv, int64_t seq, int64_t C, int NH, int hs, float scale) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kld = hs + 1;
  float* Qs = smem;
  float* Ks = Qs + kQueryRows * hs;
  float* Vs = Ks + kKeyTile * kld;
  const Head hd = head_of(blockIdx.y, seq, C, NH, hs);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQueryRows, stride = 3 * C;
  const int64_t last = min(seq, q0 + kQueryRows) - 1;
  load_tile(Qs, hs, qkv + hd.qkv, stride, q0, kQueryRows, seq, hs);

  constexpr int kRows = kQueryRows / kWarps;  // rows per warp: warp, warp + kWarps, ...
  float m[kRows], l[kRows], o[kRows][kSlots];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) o[i][k] = 0.0f;
  }
  for (int64_t k0 = 0; k0 <= last; k0 += kKeyTile) {
    __syncthreads();  // the previous tile is used up (and Q is loaded)
    load_tile(Ks, kld, qkv + hd.qkv + C, stride, k0, kKeyTile, seq, hs);
    load_tile(Vs, hs, qkv + hd.qkv + 2 * C, stride, k0, kKeyTile, seq, hs);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + i * kWarps;
      const int64_t t = q0 + r;
      if (t >= seq) continue;  // uniform across the warp
      const int64_t key = k0 + lane;
      const float s = key <= t ? dot(Qs + r * hs, Ks + lane * kld, hs) * scale : -INFINITY;
      const float tile_max = warp_max(s);
      if (tile_max == -INFINITY) continue;  // no key of this tile is visible to row t
      const float m_new = fmaxf(m[i], tile_max);
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float alpha = expf(m[i] - m_new);  // 0 on the row's first tile
      l[i] = l[i] * alpha + warp_sum(p);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) o[i][k] *= alpha;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int k = 0; k < kSlots; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) o[i][k] += pj * Vs[j * hs + d];
        }
      }
      m[i] = m_new;
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t t = q0 + warp + i * kWarps;
    if (t >= seq) continue;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) out[hd.row + t * C + d] = from_f<T>(o[i][k] * inv);
    }
    if (lane == 0) lse[hd.lse + t] = m[i] + logf(l[i]);
  }
}

// D[bh, t] = dout[t] . out[t] over the head's columns; one warp per row.
template <class T>
__global__ void flash_row_dot_kernel(float* D, const T* dout, const T* out, int64_t rows, int64_t seq, int64_t C,
                                     int NH, int hs) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= rows) return;  // uniform across the warp
  const int64_t bh = w / seq, t = w % seq;
  const Head hd = head_of(bh, seq, C, NH, hs);
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += to_f(dout[hd.row + t * C + d]) * to_f(out[hd.row + t * C + d]);
  acc = warp_sum(acc);
  if (lane == 0) D[hd.lse + t] = acc;
}

// dS for row r (global t) and key k0 + lane, recomputing P from lse; also P.
__device__ __forceinline__ void row_grads(const float* Qs, const float* dOs, const float* Ks, const float* Vs, int r,
                                          int64_t t, int64_t key, int hs, int kld, float scale, float row_lse,
                                          float row_d, float* p_out, float* ds_out) {
  const int lane = threadIdx.x & 31;
  float p = 0.0f, ds = 0.0f;
  if (key <= t) {
    p = expf(dot(Qs + r * hs, Ks + lane * kld, hs) * scale - row_lse);
    const float dp = dot(dOs + r * hs, Vs + lane * kld, hs);
    ds = p * (dp - row_d);
  }
  *p_out = p;
  *ds_out = ds;
}

// dK, dV for one tile of keys: grid (ceil(seq / kKeyTile), B * NH).
// smem K, V [32][hs+1]; Q, dO [kBackRows][hs]; P, dS [kBackRows][32].
template <class T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int64_t seq,
                              int64_t C, int NH, int hs, float scale) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kld = hs + 1;
  float* Ks = smem;
  float* Vs = Ks + kKeyTile * kld;
  float* Qs = Vs + kKeyTile * kld;
  float* dOs = Qs + kBackRows * hs;
  float* Ps = dOs + kBackRows * hs;
  float* dSs = Ps + kBackRows * kKeyTile;
  const Head hd = head_of(blockIdx.y, seq, C, NH, hs);
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKeyTile, stride = 3 * C;
  load_tile(Ks, kld, qkv + hd.qkv + C, stride, k0, kKeyTile, seq, hs);
  load_tile(Vs, kld, qkv + hd.qkv + 2 * C, stride, k0, kKeyTile, seq, hs);
  float dk[kEntries], dv[kEntries];
#pragma unroll
  for (int e = 0; e < kEntries; ++e) dk[e] = dv[e] = 0.0f;
  // Only rows t >= k0 see any of these keys.
  for (int64_t q0 = k0; q0 < seq; q0 += kBackRows) {
    __syncthreads();  // the previous rows are used up (and K, V are loaded)
    load_tile(Qs, hs, qkv + hd.qkv, stride, q0, kBackRows, seq, hs);
    load_tile(dOs, hs, dout + hd.row, C, q0, kBackRows, seq, hs);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBackRows / kWarps; ++i) {
      const int r = warp + i * kWarps;
      const int64_t t = q0 + r;
      float p = 0.0f, ds = 0.0f;
      if (t < seq) {
        row_grads(Qs, dOs, Ks, Vs, r, t, k0 + lane, hs, kld, scale, lse[hd.lse + t], D[hd.lse + t], &p, &ds);
      }
      Ps[r * kKeyTile + lane] = p;
      dSs[r * kKeyTile + lane] = ds;
    }
    __syncthreads();
    // Thread owns elements threadIdx.x + e * kFlashThreads of the [32][hs] tile; rows summed in order.
#pragma unroll
    for (int e = 0; e < kEntries; ++e) {
      const int idx = threadIdx.x + e * kFlashThreads;
      if (idx >= kKeyTile * hs) break;
      const int j = idx / hs, d = idx % hs;
      float sv = 0.0f, sk = 0.0f;
      for (int r = 0; r < kBackRows; ++r) {
        sv += Ps[r * kKeyTile + j] * dOs[r * hs + d];
        sk += dSs[r * kKeyTile + j] * Qs[r * hs + d];
      }
      dv[e] += sv;
      dk[e] += sk;
    }
  }
#pragma unroll
  for (int e = 0; e < kEntries; ++e) {
    const int idx = threadIdx.x + e * kFlashThreads;
    if (idx >= kKeyTile * hs) break;
    const int j = idx / hs, d = idx % hs;
    const int64_t key = k0 + j;
    if (key >= seq) continue;
    T* row = dqkv + hd.qkv + key * stride;
    add_to(&row[C + d], dk[e] * scale);
    add_to(&row[2 * C + d], dv[e]);
  }
}

// dQ for kBackRows query rows: grid (ceil(seq / kBackRows), B * NH).
// smem Q, dO [kBackRows][hs]; K, V [32][hs+1].
template <class T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int64_t seq,
                             int64_t C, int NH, int hs, float scale) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kld = hs + 1;
  float* Qs = smem;
  float* dOs = Qs + kBackRows * hs;
  float* Ks = dOs + kBackRows * hs;
  float* Vs = Ks + kKeyTile * kld;
  const Head hd = head_of(blockIdx.y, seq, C, NH, hs);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBackRows, stride = 3 * C;
  const int64_t last = min(seq, q0 + kBackRows) - 1;
  load_tile(Qs, hs, qkv + hd.qkv, stride, q0, kBackRows, seq, hs);
  load_tile(dOs, hs, dout + hd.row, C, q0, kBackRows, seq, hs);
  constexpr int kRows = kBackRows / kWarps;
  float dq[kRows][kSlots], row_lse[kRows], row_d[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t t = q0 + warp + i * kWarps;
    row_lse[i] = t < seq ? lse[hd.lse + t] : 0.0f;
    row_d[i] = t < seq ? D[hd.lse + t] : 0.0f;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) dq[i][k] = 0.0f;
  }
  for (int64_t k0 = 0; k0 <= last; k0 += kKeyTile) {
    __syncthreads();
    load_tile(Ks, kld, qkv + hd.qkv + C, stride, k0, kKeyTile, seq, hs);
    load_tile(Vs, kld, qkv + hd.qkv + 2 * C, stride, k0, kKeyTile, seq, hs);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + i * kWarps;
      const int64_t t = q0 + r;
      if (t >= seq) continue;  // uniform across the warp
      float p, ds;
      row_grads(Qs, dOs, Ks, Vs, r, t, k0 + lane, hs, kld, scale, row_lse[i], row_d[i], &p, &ds);
      for (int j = 0; j < kKeyTile; ++j) {
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int k = 0; k < kSlots; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) dq[i][k] += dsj * Ks[j * kld + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t t = q0 + warp + i * kWarps;
    if (t >= seq) continue;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) add_to(&dqkv[hd.qkv + t * stride + d], dq[i][k] * scale);
    }
  }
}

Status check_shape(const char* op, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  if (B < 1 || seq < 1 || NH < 1 || C % NH != 0 || C / NH > kMaxFlashHeadSize || B * NH > 65535) {
    return invalid_argument(std::string(op) + ": needs B, T, NH >= 1, C divisible by NH, head size C/NH <= " +
                                  std::to_string(kMaxFlashHeadSize) + " and B*NH <= 65535; got B=" +
                                  std::to_string(B) + " T=" + std::to_string(seq) + " C=" + std::to_string(C) +
                                  " NH=" + std::to_string(NH));
  }
  return ok_status();
}

// Launches `kernel` with `smem` bytes of dynamic shared memory, opting in
// above the default 48 KiB (every supported architecture allows the at most
// ~52 KiB these kernels take at head size 128).
template <class Kernel, class... Args>
Status launch(const char* what, Kernel kernel, dim3 grid, size_t smem, cudaStream_t s, Args... args) {
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kFlashThreads, smem, s>>>(args...);
  return launched(what);
}

unsigned tiles(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

template <class T>
Status flash_attention_forward(cudaStream_t s, T* out, float* lse, const T* qkv, int64_t B, int64_t seq, int64_t C,
                               int64_t NH) {
  STRATA_RETURN_IF_ERROR(check_shape("flash_attention_forward", B, seq, C, NH));
  const int hs = static_cast<int>(C / NH);
  const size_t smem = sizeof(float) * static_cast<size_t>(kQueryRows * hs + kKeyTile * (hs + 1) + kKeyTile * hs);
  const dim3 grid(tiles(seq, kQueryRows), static_cast<unsigned>(B * NH));
  return launch("flash_attention_forward", flash_forward_kernel<T>, grid, smem, s, out, lse, qkv, seq, C,
                static_cast<int>(NH), hs, 1.0f / sqrtf(static_cast<float>(hs)));
}

template <class T>
Status flash_attention_backward(cudaStream_t s, T* dqkv, float* workspace, const T* dout, const T* out, const T* qkv,
                                const float* lse, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  STRATA_RETURN_IF_ERROR(check_shape("flash_attention_backward", B, seq, C, NH));
  const int hs = static_cast<int>(C / NH), nh = static_cast<int>(NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const int64_t rows = B * NH * seq;
  flash_row_dot_kernel<T><<<tiles(rows * 32, detail::kThreads), detail::kThreads, 0, s>>>(workspace, dout, out, rows,
                                                                                          seq, C, nh, hs);
  STRATA_RETURN_IF_ERROR(launched("flash_attention_backward D"));
  const size_t kv_smem =
      sizeof(float) * static_cast<size_t>(2 * kKeyTile * (hs + 1) + 2 * kBackRows * hs + 2 * kBackRows * kKeyTile);
  STRATA_RETURN_IF_ERROR(launch("flash_attention_backward dk/dv", flash_backward_dkv_kernel<T>,
                                dim3(tiles(seq, kKeyTile), static_cast<unsigned>(B * NH)), kv_smem, s, dqkv, dout,
                                qkv, lse, static_cast<const float*>(workspace), seq, C, nh, hs, scale));
  const size_t q_smem = sizeof(float) * static_cast<size_t>(2 * kBackRows * hs + 2 * kKeyTile * (hs + 1));
  return launch("flash_attention_backward dq", flash_backward_dq_kernel<T>,
                dim3(tiles(seq, kBackRows), static_cast<unsigned>(B * NH)), q_smem, s, dqkv, dout, qkv, lse,
                static_cast<const float*>(workspace), seq, C, nh, hs, scale);
}

#define STRATA_FLASH_INSTANTIATE(T)                                                                                 \
  template Status flash_attention_forward<T>(cudaStream_t, T*, float*, const T*, int64_t, int64_t, int64_t,        \
                                             int64_t);                                                           \
  template Status flash_attention_backward<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const float*, \
                                              int64_t, int64_t, int64_t, int64_t);

STRATA_FLASH_INSTANTIATE(float)
STRATA_FLASH_INSTANTIATE(__nv_bfloat16)
STRATA_FLASH_INSTANTIATE(__half)

}  // namespace strata::gpu::cuda
