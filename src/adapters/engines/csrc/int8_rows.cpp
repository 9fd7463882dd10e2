// The per-token steps around an int8 GEMM, one pass each (vllm-srun, engines/int8_kernels.py).
//
// quantize_tokens: each row of X [M, K] onto uint8 with its own step and zero point: the row's
// range [min(x, 0), max(x, 0)] onto 0..253, codes = trunc(x * inv + (zero + 0.5)). Rows past M
// (up to ROWS, the GEMM's bucket) are zero codes.
// finish_rows: y = (acc - zero * colsum) * step + bias on the first M rows of ACC, in place.
//
// Both compute exactly what the torch fallback in engines/cpu_int8.py computes (the same float
// operations in the same order; built with -ffp-contract=off so no multiply-add is fused), so a
// package answers the same with or without this op. Each row is one task: its result depends on
// its own values only, whichever thread runs it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

namespace {

constexpr float kLevels = 253.0f;
constexpr float kTiny = 1e-30f;

void quantize_row(const float* x, int64_t k, uint8_t* codes, float* step_out, float* zero_out) {
  float lo = 0.0f, hi = 0.0f;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 vlo = _mm512_setzero_ps(), vhi = _mm512_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    vlo = _mm512_min_ps(vlo, v);
    vhi = _mm512_max_ps(vhi, v);
  }
  lo = _mm512_reduce_min_ps(vlo);
  hi = _mm512_reduce_max_ps(vhi);
#endif
  for (; i < k; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const float step = std::max(hi - lo, kTiny) / kLevels;
  const float inv = 1.0f / step;
  const float zero = std::ceil(-(lo * inv));
  const float offset = zero + 0.5f;
  i = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv), voff = _mm512_set1_ps(offset);
  for (; i + 16 <= k; i += 16) {
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv), voff);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtusepi32_epi8(_mm512_cvttps_epu32(v)));
  }
#endif
  for (; i < k; ++i) codes[i] = static_cast<uint8_t>(x[i] * inv + offset);
  *step_out = step;
  *zero_out = zero;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_tokens(const at::Tensor& x, int64_t rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 [M, K]");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(rows >= m, "rows must be at least x's rows");
  auto codes = at::empty({rows, k}, x.options().dtype(at::kByte));
  auto step = at::empty({m, 1}, x.options());
  auto zero = at::empty({m, 1}, x.options());
  const float* xp = x.data_ptr<float>();
  uint8_t* cp = codes.data_ptr<uint8_t>();
  float* sp = step.data_ptr<float>();
  float* zp = zero.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  at::parallel_for(0, m, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) quantize_row(xp + r * k, k, cp + r * k, sp + r, zp + r);
  });
  if (rows > m) std::fill(cp + m * k, cp + rows * k, uint8_t{0});
  return {codes, step, zero};
}

void finish_rows(const at::Tensor& acc, const at::Tensor& zero, const at::Tensor& step, const at::Tensor& colsum,
                 const at::Tensor& bias) {
  TORCH_CHECK(acc.dim() == 2 && acc.scalar_type() == at::kFloat && acc.is_contiguous(), "acc: contiguous float32");
  const int64_t m = zero.numel(), n = acc.size(1);
  TORCH_CHECK(acc.size(0) >= m && step.numel() == m && colsum.numel() == n && bias.numel() == n, "shapes");
  float* ap = acc.data_ptr<float>();
  const float* zp = zero.data_ptr<float>();
  const float* sp = step.data_ptr<float>();
  const float* cs = colsum.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  at::parallel_for(0, m, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* y = ap + r * n;
      const float z = zp[r], s = sp[r];
      for (int64_t j = 0; j < n; ++j) {
        const float shared = z * cs[j];
        y[j] = (y[j] - shared) * s + bp[j];
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY(srun_int8, m) {
  m.def("quantize_tokens(Tensor x, int rows) -> (Tensor, Tensor, Tensor)", &quantize_tokens);
  m.def("finish_rows(Tensor(a!) acc, Tensor zero, Tensor step, Tensor colsum, Tensor bias) -> ()", &finish_rows);
}
