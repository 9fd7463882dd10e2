// The Gated DeltaNet token mixer's two sequence steps on a CPU (engines/cpu_hybrid.py), over rows laid
// back to back ([N, ...] tokens, each row's length): both restart at every row's first token, and a
// row's numbers depend on its own tokens only, computed the same way whatever else the forward holds
// and whichever thread runs it.
//
// `causal_conv_rows`: the causal depthwise convolution (kernel K) and SiLU. A token reads itself and
// the K - 1 inputs before it in its row, before the row's first token the row's tail (zeros, or
// the last K - 1 inputs of a shared state the row continues). The K products are summed in a fixed
// order, every channel at once (the weight read as [K, C]), and SiLU is taken a token at a time
// with a polynomial exp (a token's bits never depend on its place in the forward, which torch's
// elementwise SiLU over the whole matrix does not promise). Returns the rows' new tails too.
//
// `gated_delta_rows`: the gated delta rule, token by token: S <- S exp(g); S <- S + k (beta (v - S^T
// k))^T; o = S^T q, with q and k L2-normed per key head (q scaled by Dk^-1/2) and each key head
// serving value_heads / key_heads consecutive value heads. A value's columns never mix in the rule,
// so the state [Dk, Dv] of a (row, value head) is cut into blocks of two vectors of columns (16 with
// AVX2, 32 with AVX-512), each one task that keeps its block (Dk x 16 floats, 8 KB at Dk = 128)
// in L1 over the whole row and reads it twice a token: once for S^T k (four independent sums a
// vector, added in a fixed order), once to update it and read S^T q. That is about 3 Dk Dv
// multiply-adds a token, fewer than the chunked form's (its within-chunk products and the UT
// transform's triangular solve suit a GPU's matrix units; on this CPU the torch solve alone took a
// fifth of a forward). Tasks are taken longest row first from a shared counter (balance); which
// thread runs one never changes its numbers.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "gated_delta.h"

namespace {

// The columns of the state a task keeps: one vector register of floats (16 with AVX-512, else 8).
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float Lanes __attribute__((vector_size(kLanes * 4), aligned(kLanes * 4)));
typedef float LanesU __attribute__((vector_size(kLanes * 4), aligned(4)));  // the same, at any float address
constexpr int64_t kBlock = 2 * kLanes;  // the columns of the state a task keeps: two vectors

inline Lanes load(const float* p, int64_t cols) {
  if (cols == kLanes) return *reinterpret_cast<const LanesU*>(p);
  Lanes v = {};
  std::memcpy(&v, p, sizeof(float) * static_cast<size_t>(cols));
  return v;
}

inline void store(float* p, const Lanes& v, int64_t cols) {
  if (cols == kLanes) {
    *reinterpret_cast<LanesU*>(p) = v;
  } else {
    std::memcpy(p, &v, sizeof(float) * static_cast<size_t>(cols));
  }
}

typedef int32_t IntLanes __attribute__((vector_size(kLanes * 4)));

// exp(x) for x in [-87, 88] (clamped there), about 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, a
// degree-6 polynomial for e^r, and 2^n written into the exponent bits.
inline Lanes exp_lanes(Lanes x) {
  x = x < -87.0f ? Lanes{} - 87.0f : x;
  x = x > 88.0f ? Lanes{} + 88.0f : x;
  const Lanes n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded to the nearest integer
  const Lanes r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  Lanes p = Lanes{} + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const IntLanes bits = (__builtin_convertvector(n, IntLanes) + 127) << 23;
  Lanes scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// X <- X / (1 + exp(-X)) over a token's C channels, a vector at a time (the last one padded): a
// channel's bits never depend on the token's place in the forward.
inline void silu_row(float* x, int64_t c) {
  for (int64_t at = 0; at < c; at += kLanes) {
    const int64_t cols = std::min(kLanes, c - at);
    Lanes v = load(x + at, cols);
    v = v / (1.0f + exp_lanes(-v));
    store(x + at, v, cols);
  }
}

std::vector<int64_t> row_starts(const std::vector<int64_t>& lengths, int64_t tokens, const char* what) {
  std::vector<int64_t> starts(lengths.size());
  int64_t at = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    TORCH_CHECK(lengths[r] > 0, what, ": every row needs at least one token");
    starts[r] = at;
    at += lengths[r];
  }
  TORCH_CHECK(!lengths.empty() && at == tokens, what, ": the rows' lengths add up to ", at, ", not to the ", tokens,
              " tokens");
  return starts;
}

// The prefix a row continues: TAIL / INITIAL is empty (none), [1, ...] (every row the same) or [R, ...].
const float* per_row(const at::Tensor& t, int64_t r, int64_t stride) {
  if (t.numel() == 0) return nullptr;
  return t.data_ptr<float>() + (t.size(0) == 1 ? 0 : r) * stride;
}

void check_prefix(const at::Tensor& t, int64_t rows, at::IntArrayRef inner, const char* what) {
  if (t.numel() == 0) return;
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 1 + static_cast<int64_t>(inner.size()),
              what, " must be a contiguous float32 tensor");
  TORCH_CHECK(t.size(0) == 1 || t.size(0) == rows, what, " holds one entry or one a row");
  for (size_t i = 0; i < inner.size(); ++i)
    TORCH_CHECK(t.size(static_cast<int64_t>(i) + 1) == inner[i], what, " has the wrong shape");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> causal_conv_rows(const at::Tensor& x, const at::Tensor& weight,
                                                    const std::vector<int64_t>& lengths, const at::Tensor& tail) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "causal_conv: x is a contiguous float32 [N, C] matrix");
  const int64_t n = x.size(0), c = x.size(1);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == c && weight.size(1) >= 1 && weight.scalar_type() == at::kFloat,
              "causal_conv: the weight is a float32 [C, K] matrix");
  const int64_t k = weight.size(1), rows = static_cast<int64_t>(lengths.size());
  const auto starts = row_starts(lengths, n, "causal_conv");
  check_prefix(tail, rows, {k - 1, c}, "causal_conv: the tail");
  const at::Tensor taps = weight.t().contiguous();  // [K, C]: a tap's weights for every channel side by side
  const float* w = taps.data_ptr<float>();
  const float* in = x.data_ptr<float>();
  const std::vector<float> zeros(static_cast<size_t>(c), 0.0f);
  std::vector<int64_t> row_of(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) std::fill_n(row_of.begin() + starts[r], lengths[r], r);
  // input P of row R (P < 0: its tail, or zeros)
  auto source = [&](int64_t r, int64_t p) -> const float* {
    if (p >= 0) return in + (starts[r] + p) * c;
    const float* t = per_row(tail, r, (k - 1) * c);
    return t != nullptr ? t + (k - 1 + p) * c : zeros.data();
  };
  auto out = at::empty({n, c}, x.options());
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t stop) {
    for (int64_t i = begin; i < stop; ++i) {
      const int64_t r = row_of[static_cast<size_t>(i)], j = i - starts[r];
      float* dst = o + i * c;
      const float* first = source(r, j - (k - 1));
      for (int64_t ch = 0; ch < c; ++ch) dst[ch] = first[ch] * w[ch];
      for (int64_t m = 1; m < k; ++m) {
        const float* src = source(r, j - (k - 1) + m);
        const float* wm = w + m * c;
        for (int64_t ch = 0; ch < c; ++ch) dst[ch] += src[ch] * wm[ch];
      }
      silu_row(dst, c);
    }
  });
  auto tails = at::empty({rows, k - 1, c}, x.options());
  float* tp = tails.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k - 1; ++i)
      std::memcpy(tp + (r * (k - 1) + i) * c, source(r, lengths[r] - (k - 1) + i), sizeof(float) * c);
  return {out, tails};
}

std::tuple<at::Tensor, at::Tensor> gated_delta_rows(const at::Tensor& mixed, const at::Tensor& g,
                                                    const at::Tensor& beta, const std::vector<int64_t>& lengths,
                                                    const at::Tensor& initial, int64_t key_heads,
                                                    int64_t value_heads, int64_t key_dim, int64_t value_dim,
                                                    bool final_state) {
  TORCH_CHECK(key_heads > 0 && value_heads % key_heads == 0 && key_dim > 0 && value_dim > 0,
              "gated_delta: key heads must divide value heads");
  const int64_t hk = key_heads, hv = value_heads, dk = key_dim, dv = value_dim;
  const int64_t width = 2 * hk * dk + hv * dv;
  TORCH_CHECK(mixed.dim() == 2 && mixed.size(1) == width && mixed.scalar_type() == at::kFloat && mixed.is_contiguous(),
              "gated_delta: the convolution's output is a contiguous float32 [N, ", width, "] matrix");
  const int64_t n = mixed.size(0), rows = static_cast<int64_t>(lengths.size());
  for (const auto* t : {&g, &beta})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == n && t->size(1) == hv && t->scalar_type() == at::kFloat &&
                    t->is_contiguous(),
                "gated_delta: g and beta are contiguous float32 [N, value heads] matrices");
  const auto starts = row_starts(lengths, n, "gated_delta");
  check_prefix(initial, rows, {hv, dk, dv}, "gated_delta: the initial state");
  const float* in = mixed.data_ptr<float>();
  // every token's queries and keys L2-normed (queries also scaled), [N, key heads, 2, Dk]; decays exp(g)
  std::vector<float> qk(static_cast<size_t>(n * hk * 2 * dk));
  std::vector<float> decay(static_cast<size_t>(n * hv));
  const float* gp = g.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t stop) {
    for (int64_t t = begin; t < stop; ++t) {
      for (int64_t h = 0; h < hk; ++h)
        for (int64_t which = 0; which < 2; ++which) {  // 0: the query, 1: the key
          const float* src = in + t * width + which * hk * dk + h * dk;
          float part[kLanes] = {};
          int64_t i = 0;
          for (; i + kLanes <= dk; i += kLanes)
            for (int64_t l = 0; l < kLanes; ++l) part[l] += src[i + l] * src[i + l];
          for (; i < dk; ++i) part[i % kLanes] += src[i] * src[i];
          float sum = 0.0f;
          for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
          const float inv = 1.0f / std::sqrt(sum + 1e-6f);
          float* dst = qk.data() + ((t * hk + h) * 2 + which) * dk;
          for (i = 0; i < dk; ++i) dst[i] = which == 0 ? src[i] * inv * scale : src[i] * inv;
        }
      for (int64_t h = 0; h < hv; ++h) decay[static_cast<size_t>(t * hv + h)] = std::exp(gp[t * hv + h]);
    }
  });
  auto out = at::empty({n, hv, dv}, mixed.options());
  auto final = final_state ? at::empty({rows, hv, dk, dv}, mixed.options()) : at::empty({0}, mixed.options());
  float* op = out.data_ptr<float>();
  float* fp = final_state ? final.data_ptr<float>() : nullptr;
  const float* bp = beta.data_ptr<float>();
  const float* values = in + 2 * hk * dk;
  const int64_t blocks = (dv + kBlock - 1) / kBlock, rep = hv / hk;
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  const int64_t tasks = rows * hv * blocks;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::max<int64_t>(1, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    // the block, aligned: row i of the state's two vectors at S[2 i] and S[2 i + 1]
    std::vector<float> buffer(static_cast<size_t>(2 * dk * kLanes + kLanes));
    const uintptr_t misaligned = reinterpret_cast<uintptr_t>(buffer.data()) / sizeof(float) % kLanes;
    Lanes* s = reinterpret_cast<Lanes*>(buffer.data() + (kLanes - misaligned) % kLanes);
    for (int64_t task = next++; task < tasks; task = next++) {
      const int64_t r = order[static_cast<size_t>(task / (hv * blocks))];
      const int64_t h = task / blocks % hv, c0 = task % blocks * kBlock;
      const int64_t lo = std::min(kLanes, dv - c0), hi = std::max<int64_t>(0, std::min(kLanes, dv - c0 - kLanes));
      const int64_t kh = h / rep;
      const float* init = per_row(initial, r, hv * dk * dv);
      for (int64_t i = 0; i < dk; ++i) {
        const float* at = init != nullptr ? init + (h * dk + i) * dv + c0 : nullptr;
        s[2 * i] = at != nullptr ? load(at, lo) : Lanes{};
        s[2 * i + 1] = at != nullptr && hi > 0 ? load(at + kLanes, hi) : Lanes{};
      }
      for (int64_t t = starts[r]; t < starts[r] + lengths[r]; ++t) {
        const float* q = qk.data() + (t * hk + kh) * 2 * dk;
        const float* k = q + dk;
        const float d = decay[static_cast<size_t>(t * hv + h)], b = bp[t * hv + h];
        Lanes a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
        int64_t i = 0;
        for (; i + 4 <= dk; i += 4) {
          a0 += s[2 * i] * k[i];
          b0 += s[2 * i + 1] * k[i];
          a1 += s[2 * i + 2] * k[i + 1];
          b1 += s[2 * i + 3] * k[i + 1];
          a2 += s[2 * i + 4] * k[i + 2];
          b2 += s[2 * i + 5] * k[i + 2];
          a3 += s[2 * i + 6] * k[i + 3];
          b3 += s[2 * i + 7] * k[i + 3];
        }
        for (; i < dk; ++i) {
          a0 += s[2 * i] * k[i];
          b0 += s[2 * i + 1] * k[i];
        }
        // S^T k before the decay, then each column's correction
        const float* v = values + t * width + h * dv + c0;
        const Lanes da = (load(v, lo) - ((a0 + a1) + (a2 + a3)) * d) * b;
        const Lanes db = hi > 0 ? (load(v + kLanes, hi) - ((b0 + b1) + (b2 + b3)) * d) * b : Lanes{};
        Lanes o0 = {}, o1 = {}, p0 = {}, p1 = {};
        for (i = 0; i + 2 <= dk; i += 2) {
          s[2 * i] = s[2 * i] * d + da * k[i];
          s[2 * i + 1] = s[2 * i + 1] * d + db * k[i];
          s[2 * i + 2] = s[2 * i + 2] * d + da * k[i + 1];
          s[2 * i + 3] = s[2 * i + 3] * d + db * k[i + 1];
          o0 += s[2 * i] * q[i];
          p0 += s[2 * i + 1] * q[i];
          o1 += s[2 * i + 2] * q[i + 1];
          p1 += s[2 * i + 3] * q[i + 1];
        }
        for (; i < dk; ++i) {
          s[2 * i] = s[2 * i] * d + da * k[i];
          s[2 * i + 1] = s[2 * i + 1] * d + db * k[i];
          o0 += s[2 * i] * q[i];
          p0 += s[2 * i + 1] * q[i];
        }
        float* o = op + (t * hv + h) * dv + c0;
        store(o, o0 + o1, lo);
        if (hi > 0) store(o + kLanes, p0 + p1, hi);
      }
      if (fp != nullptr)
        for (int64_t i = 0; i < dk; ++i) {
          float* at = fp + ((r * hv + h) * dk + i) * dv + c0;
          store(at, s[2 * i], lo);
          if (hi > 0) store(at + kLanes, s[2 * i + 1], hi);
        }
    }
  });
  return {out, final};
}

namespace {

std::tuple<at::Tensor, at::Tensor> causal_conv_op(const at::Tensor& x, const at::Tensor& weight,
                                                  std::vector<int64_t> lengths, const at::Tensor& tail) {
  return causal_conv_rows(x, weight, lengths, tail);
}

std::tuple<at::Tensor, at::Tensor> gated_delta_op(const at::Tensor& mixed, const at::Tensor& g, const at::Tensor& beta,
                                                  std::vector<int64_t> lengths, const at::Tensor& initial,
                                                  int64_t key_heads, int64_t value_heads, int64_t key_dim,
                                                  int64_t value_dim, bool final_state) {
  return gated_delta_rows(mixed, g, beta, lengths, initial, key_heads, value_heads, key_dim, value_dim, final_state);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(srun_cpu, m) {
  m.def("causal_conv(Tensor x, Tensor weight, int[] lengths, Tensor tail) -> (Tensor, Tensor)", &causal_conv_op);
  m.def(
      "gated_delta_rule(Tensor mixed, Tensor g, Tensor beta, int[] lengths, Tensor initial, int key_heads, "
      "int value_heads, int key_dim, int value_dim, bool final_state) -> (Tensor, Tensor)",
      &gated_delta_op);
}
