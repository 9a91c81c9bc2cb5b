// Every CUDA op against the host op on fresh random inputs (fp32):
// ||out - ref|| / ||ref|| < 1e-5, no NaN, and every output element written
// (outputs are poisoned with NaN first). Gradients accumulate (+=), so they
// start from the same random values on both sides. Needs a GPU; skips with
// the reason otherwise. Sizes are awkward, and the loss runs with more rows
// and vocabulary than one chunk.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/ops.h"
#include "gpu/device_factory.h"
#include "gpu/host/ops.h"
#include "tests/gpu/cuda_ops_fixture.h"
#include "tests/tolerance.h"

namespace strata::gpu::cuda {
namespace {

TEST_F(CudaOps, EmbeddingLayerNormGeluResidual) {
  const int64_t B = 3, T = 37, C = 72, V = 101, N = B * T;
  std::vector<int32_t> tok(N);
  for (auto& t : tok) t = static_cast<int32_t>(rng_() % V);
  Vec wte = random(V * C), wpe = random(T * C), out(N * C);
  host::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  float* d_out = poisoned(N * C);
  ASSERT_TRUE(embedding_forward(stream_, d_out, upload(tok), upload(wte), upload(wpe), B, T, C).ok());
  expect_close("embedding out", d_out, out);
  Vec dout = random(N * C), dwte = random(V * C), dwpe = random(T * C);
  float* g_wte = upload(dwte);
  float* g_wpe = upload(dwpe);
  host::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  ASSERT_TRUE(embedding_backward(stream_, g_wte, g_wpe, upload(dout), upload(tok), B, T, C).ok());
  expect_close("dwte", g_wte, dwte);
  expect_close("dwpe", g_wpe, dwpe);

  Vec x = random(N * C, 3.0f), w = random(C), b = random(C), ln(N * C), mean(N), rstd(N);
  host::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  float *d_ln = poisoned(N * C), *d_mean = poisoned(N), *d_rstd = poisoned(N);
  float *d_x = upload(x), *d_w = upload(w);
  ASSERT_TRUE(layernorm_forward(stream_, d_ln, d_mean, d_rstd, d_x, d_w, upload(b), N, C).ok());
  expect_close("layernorm out", d_ln, ln);
  expect_close("rstd", d_rstd, rstd);
  Vec dx = random(N * C), dw = random(C), db = random(C);
  float *g_x = upload(dx), *g_w = upload(dw), *g_b = upload(db);
  host::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                           N, C);
  ASSERT_TRUE(layernorm_backward(stream_, g_x, g_w, g_b, upload(dout), d_x, d_w, d_mean, d_rstd, N, C).ok());
  expect_close("layernorm dx", g_x, dx);
  expect_close("layernorm dw", g_w, dw);
  expect_close("layernorm db", g_b, db);

  Vec gin = random(N * C, 2.0f), gout(N * C);
  host::gelu_forward(gout.data(), gin.data(), N * C);
  float* d_gin = upload(gin);
  float* d_gout = poisoned(N * C);
  ASSERT_TRUE(gelu_forward(stream_, d_gout, d_gin, N * C).ok());
  expect_close("gelu", d_gout, gout);
  Vec gdx = random(N * C);
  float* g_gdx = upload(gdx);
  host::gelu_backward(gdx.data(), gin.data(), dout.data(), N * C);
  ASSERT_TRUE(gelu_backward(stream_, g_gdx, d_gin, upload(dout), N * C).ok());
  expect_close("gelu dx", g_gdx, gdx);

  Vec a = random(N * C), r(N * C);
  host::residual_forward(r.data(), a.data(), gin.data(), N * C);
  float* d_r = poisoned(N * C);
  ASSERT_TRUE(residual_forward(stream_, d_r, upload(a), d_gin, N * C).ok());
  expect_close("residual", d_r, r);
}

TEST_F(CudaOps, MatmulAndAttention) {
  const int64_t B = 2, T = 33, C = 48, NH = 3, N = B * T, OC = 3 * C;
  Vec x = random(N * C), w = random(C * OC, 0.2f), bias = random(OC), out(N * OC);
  host::matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, C, OC);
  float *d_x = upload(x), *d_w = upload(w), *d_out = poisoned(N * OC);
  ASSERT_TRUE(matmul_forward(blas_, stream_, d_out, d_x, d_w, upload(bias), N, C, OC).ok());
  expect_close("matmul out", d_out, out);
  Vec dout = random(N * OC), dx = random(N * C), dw = random(C * OC), db = random(OC);
  float *g_x = upload(dx), *g_w = upload(dw), *g_b = upload(db);
  host::matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
  ASSERT_TRUE(matmul_backward(blas_, stream_, g_x, g_w, g_b, upload(dout), d_x, d_w, N, C, OC).ok());
  expect_close("matmul dx", g_x, dx);
  expect_close("matmul dw", g_w, dw);
  expect_close("matmul dbias", g_b, db);

  Vec qkv = out, y(N * C), att(B * NH * T * T);
  host::attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
  float *d_y = poisoned(N * C), *d_att = poisoned(B * NH * T * T);
  ASSERT_TRUE(attention_forward(stream_, d_y, d_att, d_out, B, T, C, NH).ok());
  expect_close("attention out", d_y, y);
  expect_close("attention probabilities", d_att, att);
  Vec dy = random(N * C), dqkv = random(N * 3 * C);
  float* g_qkv = upload(dqkv);
  host::attention_backward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
  ASSERT_TRUE(attention_backward(stream_, g_qkv, poisoned(B * NH * T * T), upload(dy), d_out, d_att, B, T, C, NH).ok());
  expect_close("attention dqkv", g_qkv, dqkv);
}

// The fused attention against the host's lse-keeping attention: output,
// log-sum-exp and accumulated dqkv, on shapes with partial tiles, head sizes
// from 20 to the largest (128), and more rows than one tile.
TEST_F(CudaOps, FlashAttentionMatchesHost) {
  struct Shape {
    int64_t B, T, C, NH;
  };
  for (Shape sh : {Shape{2, 70, 128, 2}, Shape{1, 45, 128, 1}, Shape{3, 17, 60, 3}, Shape{1, 1, 32, 1}}) {
    SCOPED_TRACE("B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) + " C=" + std::to_string(sh.C) +
                 " NH=" + std::to_string(sh.NH));
    const int64_t N = sh.B * sh.T, C = sh.C, rows = sh.B * sh.NH * sh.T;
    Vec qkv = random(N * 3 * C), y(N * C), lse(rows), scratch(host::attention_scratch_elements(sh.T));
    host::flash_attention_forward(y.data(), lse.data(), scratch.data(), qkv.data(), sh.B, sh.T, C, sh.NH);
    float *d_qkv = upload(qkv), *d_y = poisoned(N * C), *d_lse = poisoned(rows);
    ASSERT_TRUE(flash_attention_forward(stream_, d_y, d_lse, d_qkv, sh.B, sh.T, C, sh.NH).ok());
    expect_close("flash attention out", d_y, y);
    expect_close("flash attention lse", d_lse, lse);
    Vec dy = random(N * C), dqkv = random(N * 3 * C);
    float* g_qkv = upload(dqkv);
    host::flash_attention_backward(dqkv.data(), scratch.data(), dy.data(), y.data(), qkv.data(), lse.data(), sh.B,
                                   sh.T, C, sh.NH);
    ASSERT_TRUE(
        flash_attention_backward(stream_, g_qkv, poisoned(rows), upload(dy), d_y, d_qkv, d_lse, sh.B, sh.T, C, sh.NH)
            .ok());
    expect_close("flash attention dqkv", g_qkv, dqkv);
  }
}

TEST_F(CudaOps, CrossEntropyChunked) {
  const int64_t N = kCeRows + 45, C = 24, V = kCeCols + 777;
  Vec x = random(N * C), wte = random(V * C, 0.3f), lse(N);
  std::vector<int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<int32_t>(rng_() % V);
  tgt[0] = static_cast<int32_t>(V - 1);
  float loss = host::crossentropy_forward(lse.data(), x.data(), wte.data(), tgt.data(), N, C, V);
  float *d_x = upload(x), *d_wte = upload(wte), *d_loss = poisoned(1), *d_lse = poisoned(N);
  float* ws = poisoned(static_cast<size_t>(crossentropy_workspace_floats(N)));
  int32_t* d_tgt = upload(tgt);
  ASSERT_TRUE(crossentropy_forward(blas_, stream_, d_loss, d_lse, ws, d_x, d_wte, d_tgt, N, C, V).ok());
  expect_close("loss", d_loss, Vec{loss});
  expect_close("lse", d_lse, lse);
  Vec dx = random(N * C), dwte = random(V * C);
  float *g_x = upload(dx), *g_wte = upload(dwte);
  host::crossentropy_backward(dx.data(), dwte.data(), x.data(), wte.data(), tgt.data(), lse.data(), 1.0f, N, C, V);
  ASSERT_TRUE(crossentropy_backward(blas_, stream_, g_x, g_wte, ws, d_x, d_wte, d_tgt, d_lse, 1.0f, N, C, V).ok());
  expect_close("loss dx", g_x, dx);
  expect_close("loss dwte", g_wte, dwte);
}

TEST_F(CudaOps, CopiesDeviceToDeviceInStreamOrder) {
  Vec v(4096);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  const float* src = upload(v);
  float* dst = poisoned(v.size());
  ASSERT_TRUE(dev_->copy_on_device(handle_, dst, src, v.size() * 4).ok());
  const Vec got = download(dst, v.size());
  EXPECT_EQ(std::memcmp(got.data(), v.data(), v.size() * 4), 0);
}

TEST_F(CudaOps, BudgetIsHardOnTheGpuToo) {
  Result<std::unique_ptr<CudaDevice>> small = CudaDevice::create({0, 1 << 20, 512ull << 20, 4, 64});
  ASSERT_TRUE(small) << small.error().to_string();
  Result<DeviceMemory> a = (*small)->allocate(800 << 10, "a");
  ASSERT_TRUE(a);
  Result<DeviceMemory> b = (*small)->allocate(800 << 10, "block 3 weights");
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.error().message().find("block 3 weights"), std::string::npos);
}


// A whole block, forward and backward, on the GPU against the host block.

using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaOpsLowPrecision, HalfTypes);

TYPED_TEST(CudaOpsLowPrecision, LayerNormGeluMatmulAttention) {
  using T = TypeParam;
  const int64_t B = 2, Tn = 24, C = 64, NH = 4, N = B * Tn;
  Vec x = this->random(N * C, 2.0f), w = this->random(C), b = this->random(C);
  T *d_x = this->upload_rounded(x), *d_w = this->upload_rounded(w), *d_b = this->upload_rounded(b);
  Vec ln(N * C), mean(N), rstd(N);
  host::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  T* d_ln = this->poisoned_half(N * C);
  float *d_mean = this->poisoned(N), *d_rstd = this->poisoned(N);
  ASSERT_TRUE(layernorm_forward(this->stream_, d_ln, d_mean, d_rstd, d_x, d_w, d_b, N, C).ok());
  this->expect_close_half("layernorm", d_ln, ln);

  Vec g = this->random(N * C, 2.0f), gout(N * C);
  T* d_g = this->upload_rounded(g);
  host::gelu_forward(gout.data(), g.data(), N * C);
  T* d_gout = this->poisoned_half(N * C);
  ASSERT_TRUE(gelu_forward(this->stream_, d_gout, d_g, N * C).ok());
  this->expect_close_half("gelu", d_gout, gout);

  Vec wq = this->random(C * 3 * C, 0.2f), bq = this->random(3 * C), qkv(N * 3 * C);
  T *d_wq = this->upload_rounded(wq), *d_bq = this->upload_rounded(bq);
  host::matmul_forward(qkv.data(), x.data(), wq.data(), bq.data(), N, C, 3 * C);
  T* d_qkv = this->poisoned_half(N * 3 * C);
  ASSERT_TRUE(matmul_forward(this->blas_, this->stream_, d_qkv, d_x, d_wq, d_bq, N, C, 3 * C).ok());
  this->expect_close_half("matmul", d_qkv, qkv);

  // Attention from the host's qkv, rounded the same way on both sides.
  Vec q2 = qkv, y(N * C), att(B * NH * Tn * Tn);
  T* d_q2 = this->upload_rounded(q2);
  host::attention_forward(y.data(), att.data(), q2.data(), B, Tn, C, NH);
  T* d_y = this->poisoned_half(N * C);
  float* d_att = this->poisoned(B * NH * Tn * Tn);
  ASSERT_TRUE(attention_forward(this->stream_, d_y, d_att, d_q2, B, Tn, C, NH).ok());
  this->expect_close_half("attention", d_y, y);

  // The fused attention in T, backward from the output it wrote.
  Vec fy(N * C), lse(B * NH * Tn), scratch(host::attention_scratch_elements(Tn));
  host::flash_attention_forward(fy.data(), lse.data(), scratch.data(), q2.data(), B, Tn, C, NH);
  T* d_fy = this->poisoned_half(N * C);
  float* d_lse = this->poisoned(B * NH * Tn);
  ASSERT_TRUE(flash_attention_forward(this->stream_, d_fy, d_lse, d_q2, B, Tn, C, NH).ok());
  this->expect_close_half("flash attention", d_fy, fy);
  this->expect_close("flash attention lse", d_lse, lse);
  Vec dy = this->random(N * C), dq(N * 3 * C, 0.0f);
  T* d_dy = this->upload_rounded(dy);
  std::vector<uint16_t> zeros(N * 3 * C, 0);  // +0 in bf16 and fp16
  T* d_dq = reinterpret_cast<T*>(this->upload(zeros));
  host::flash_attention_backward(dq.data(), scratch.data(), dy.data(), fy.data(), q2.data(), lse.data(), B, Tn, C, NH);
  ASSERT_TRUE(
      flash_attention_backward(this->stream_, d_dq, this->poisoned(B * NH * Tn), d_dy, d_fy, d_q2, d_lse, B, Tn, C, NH)
          .ok());
  this->expect_close_half("flash attention dqkv", d_dq, dq);
}

// A whole block in T against the host's fp32 block on the same rounded
// parameters and inputs.

}  // namespace
}  // namespace strata::gpu::cuda
