// The unpadded CPU forward's own ops (vllm-srun, engines/cpu_op_library.py): attention of every row
// in one call, and the residual add + LayerNorm in one pass.
//
// Attention: QKV is [N, 3 * heads * dim] (Q, K, V of a token side by side, heads
// inside each), rows back to back; each row attends to its own tokens only, no mask.
//
// Each (row, head) is one task, computed the same way whatever else is in the forward and
// whichever thread runs it: a row's answer depends on its own tokens only (batch-invariant by
// construction). For each block of 16 queries (gathered, scaled and transposed): every key's 16
// scores in one vector (keys read in place, eight at a time), a max-subtracted softmax down the
// columns with a polynomial exp, then the weighted sum of values (vectorised across the head's
// dimensions). Every sum runs in a fixed order. A score may add a bias of the distance query - key
// (`varlen_attention_biased`) or DeBERTa's two position terms (`varlen_attention_disentangled`):
// see `Relative`. Under a causal bias a block of queries reads the keys up to its last query only.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/silu.h>
#include <torch/custom_class.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "cpu_forward.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// exp(x) for x <= 0 (scores minus their max), about 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, a
// degree-6 polynomial for e^r, and 2^n written into the exponent bits. Branch-free, so the
// compiler vectorises the loop that calls it.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

constexpr int QB = 16;  // queries per block: a key's scores for the block fill one 512-bit vector
constexpr int KG = 8;   // keys scored together (eight independent FMA chains)

// What a score adds to q · k (`Relative`): nothing, a bias of the distance, or DeBERTa's two
// disentangled terms (content-to-position and position-to-content).
enum Mode : int { kPlain = 0, kDistance = 1, kContent = 2 };

struct Scratch {
  std::vector<float> queries_t, scores;
};

// Scores are kept transposed, St[j][a] = Q[a] · K[j] for the block's QB queries: the softmax over a
// query's keys is then a column of vertical vector ops (no horizontal sums, no scalar tails), and
// the keys are read in place (a token's D values are contiguous) instead of being transposed.

#if defined(__AVX512F__)
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.3981999507e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// QT[c][a] = SCALE · Q[a][c] for the COUNT queries at Q0 (rows STRIDE apart); zeros past COUNT.
template <int D>
inline void load_queries(const float* q0, int64_t stride, int count, float scale, float* qt) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int32_t>(stride)));
  const __mmask16 live = static_cast<__mmask16>((1u << count) - 1u);
  const __m512 s = _mm512_set1_ps(scale);
  for (int c = 0; c < D; ++c) {
    const __m512 q = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, rows, q0 + c, 4);
    _mm512_storeu_ps(qt + c * QB, _mm512_mul_ps(q, s));
  }
}

// ST[j] = Σ_c QT[c] · K[j][c] for the LENGTH keys at K0 (rows STRIDE apart), KG keys at a time, for
// NB blocks of queries at once (block b's QT at QT + b * D * QB, its ST at ST + b * KEYS * QB); the
// last group repeats the last key (its extra scores land in ST's padding and are never read).
// MODE kDistance adds REL[b * QB + a - j] to query a of block b against key j; kContent adds
// Σ_c QT[c][a] · KR[c * WIDTH + b * QB + a - j] + K[j][c] · QR[c * WIDTH + b * QB + a - j]
// (`Relative`'s disentangled terms; KR, QR at the block's first query's distance 0).
template <int D, int NB, int MODE>
inline void score_keys(const float* qt, const float* k0, int64_t stride, int64_t length, int64_t keys, float* st,
                       const float* rel, const float* kr, const float* qr, int64_t width) {
  for (int64_t j = 0; j < length; j += KG) {
    const float* k[KG];
    for (int t = 0; t < KG; ++t) k[t] = k0 + std::min<int64_t>(j + t, length - 1) * stride;
    __m512 acc[NB][KG];
    for (int b = 0; b < NB; ++b)
      for (int t = 0; t < KG; ++t) acc[b][t] = _mm512_setzero_ps();
    for (int c = 0; c < D; ++c) {
      __m512 q[NB];
      for (int b = 0; b < NB; ++b) q[b] = _mm512_loadu_ps(qt + b * D * QB + c * QB);
      for (int t = 0; t < KG; ++t) {
        const __m512 kc = _mm512_set1_ps(k[t][c]);
        for (int b = 0; b < NB; ++b) {
          acc[b][t] = _mm512_fmadd_ps(q[b], kc, acc[b][t]);
          if (MODE == kContent) {  // the block's 16 distances to key j + t: 16 consecutive floats of each table
            const int64_t at = c * width + b * QB - (j + t);
            acc[b][t] = _mm512_fmadd_ps(q[b], _mm512_loadu_ps(kr + at), acc[b][t]);
            acc[b][t] = _mm512_fmadd_ps(kc, _mm512_loadu_ps(qr + at), acc[b][t]);
          }
        }
      }
    }
    if (MODE == kDistance)  // query a of block b against key j + t: REL[b * QB + a - (j + t)], 16 queries in one load
      for (int b = 0; b < NB; ++b)
        for (int t = 0; t < KG; ++t) acc[b][t] = _mm512_add_ps(acc[b][t], _mm512_loadu_ps(rel + b * QB - (j + t)));
    for (int b = 0; b < NB; ++b)
      for (int t = 0; t < KG; ++t) _mm512_storeu_ps(st + b * keys * QB + (j + t) * QB, acc[b][t]);
  }
}

// ST[j] = exp(ST[j] - max_j ST[j]) column-wise (each lane a query); writes each lane's 1 / Σ_j to INV.
inline void softmax_columns(float* st, int64_t length, float* inv) {
  __m512 most = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < length; ++j) most = _mm512_max_ps(most, _mm512_loadu_ps(st + j * QB));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; ++j) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(st + j * QB), most));
    _mm512_storeu_ps(st + j * QB, e);
    sum = _mm512_add_ps(sum, e);
  }
  _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
}

// OUT[a] = INV[a] · Σ_j ST[j][a] · V[j] for the COUNT queries (output rows WIDTH apart), QA queries
// of D / 16 vectors each at a time.
template <int D>
inline void weighted_values(const float* st, const float* inv, int64_t length, const float* v, int64_t stride,
                            int count, float* out, int64_t width) {
  constexpr int W = D / 16;
  constexpr int QA = W == 1 ? 16 : W == 2 ? 8 : W <= 4 ? 4 : W <= 8 ? 2 : 1;
  for (int a0 = 0; a0 < count; a0 += QA) {
    __m512 acc[QA][W];
    for (int a = 0; a < QA; ++a)
      for (int w = 0; w < W; ++w) acc[a][w] = _mm512_setzero_ps();
    for (int64_t j = 0; j < length; ++j) {
      const float* vj = v + j * stride;
      __m512 row[W];
      for (int w = 0; w < W; ++w) row[w] = _mm512_loadu_ps(vj + 16 * w);
      for (int a = 0; a < QA; ++a) {
        const __m512 p = _mm512_set1_ps(st[j * QB + a0 + a]);
        for (int w = 0; w < W; ++w) acc[a][w] = _mm512_fmadd_ps(p, row[w], acc[a][w]);
      }
    }
    for (int a = 0; a < QA && a0 + a < count; ++a) {
      const __m512 scale = _mm512_set1_ps(inv[a0 + a]);
      for (int w = 0; w < W; ++w) _mm512_storeu_ps(out + (a0 + a) * width + 16 * w, _mm512_mul_ps(acc[a][w], scale));
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 + FMA (Zen 1-3, Intel before AVX-512): the same blocks of QB = 16 queries, each a pair of
// 256-bit halves; the same exp, the same order of every sum per lane, so a row's bits still depend
// on its own tokens only. Four keys at a time (16 registers: 8 accumulators per block).
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.3981999507e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// QT[c][a] = SCALE · Q[a][c] for the COUNT queries at Q0 (rows STRIDE apart); zeros past COUNT.
template <int D>
inline void load_queries(const float* q0, int64_t stride, int count, float scale, float* qt) {
  for (int c = 0; c < D; ++c)
    for (int a = 0; a < QB; ++a) qt[c * QB + a] = a < count ? q0[a * stride + c] * scale : 0.0f;
}

// As the AVX-512 `score_keys`: ST[j] = Σ_c QT[c] · K[j][c] (plus MODE's terms), KA keys at a time.
constexpr int KA = 4;
template <int D, int NB, int MODE>
inline void score_keys(const float* qt, const float* k0, int64_t stride, int64_t length, int64_t keys, float* st,
                       const float* rel, const float* kr, const float* qr, int64_t width) {
  for (int64_t j = 0; j < length; j += KA) {
    const float* k[KA];
    for (int t = 0; t < KA; ++t) k[t] = k0 + std::min<int64_t>(j + t, length - 1) * stride;
    for (int b = 0; b < NB; ++b) {
      __m256 acc[KA][2];
      for (int t = 0; t < KA; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
      const float* qb = qt + b * D * QB;
      for (int c = 0; c < D; ++c) {
        const __m256 lo = _mm256_loadu_ps(qb + c * QB), hi = _mm256_loadu_ps(qb + c * QB + 8);
        for (int t = 0; t < KA; ++t) {
          const __m256 kc = _mm256_set1_ps(k[t][c]);
          acc[t][0] = _mm256_fmadd_ps(lo, kc, acc[t][0]);
          acc[t][1] = _mm256_fmadd_ps(hi, kc, acc[t][1]);
          if (MODE == kContent) {
            const int64_t at = c * width + b * QB - (j + t);
            acc[t][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(kr + at), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(kr + at + 8), acc[t][1]);
            acc[t][0] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(qr + at), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(qr + at + 8), acc[t][1]);
          }
        }
      }
      for (int t = 0; t < KA; ++t) {
        if (MODE == kDistance) {
          acc[t][0] = _mm256_add_ps(acc[t][0], _mm256_loadu_ps(rel + b * QB - (j + t)));
          acc[t][1] = _mm256_add_ps(acc[t][1], _mm256_loadu_ps(rel + b * QB - (j + t) + 8));
        }
        _mm256_storeu_ps(st + b * keys * QB + (j + t) * QB, acc[t][0]);
        _mm256_storeu_ps(st + b * keys * QB + (j + t) * QB + 8, acc[t][1]);
      }
    }
  }
}

// ST[j] = exp(ST[j] - max_j ST[j]) column-wise (each lane a query); writes each lane's 1 / Σ_j to INV.
inline void softmax_columns(float* st, int64_t length, float* inv) {
  for (int h = 0; h < QB; h += 8) {
    __m256 most = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < length; ++j) most = _mm256_max_ps(most, _mm256_loadu_ps(st + j * QB + h));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < length; ++j) {
      const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(st + j * QB + h), most));
      _mm256_storeu_ps(st + j * QB + h, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_storeu_ps(inv + h, _mm256_div_ps(_mm256_set1_ps(1.0f), sum));
  }
}

// OUT[a] = INV[a] · Σ_j ST[j][a] · V[j] for the COUNT queries (output rows WIDTH apart), QA queries
// of D / 8 vectors each at a time.
template <int D>
inline void weighted_values(const float* st, const float* inv, int64_t length, const float* v, int64_t stride,
                            int count, float* out, int64_t width) {
  constexpr int W = D / 8;
  constexpr int QA = W <= 2 ? 4 : W <= 4 ? 2 : 1;
  for (int a0 = 0; a0 < count; a0 += QA) {
    __m256 acc[QA][W];
    for (int a = 0; a < QA; ++a)
      for (int w = 0; w < W; ++w) acc[a][w] = _mm256_setzero_ps();
    for (int64_t j = 0; j < length; ++j) {
      const float* vj = v + j * stride;
      for (int w = 0; w < W; ++w) {
        const __m256 row = _mm256_loadu_ps(vj + 8 * w);
        for (int a = 0; a < QA; ++a) acc[a][w] = _mm256_fmadd_ps(_mm256_set1_ps(st[j * QB + a0 + a]), row, acc[a][w]);
      }
    }
    for (int a = 0; a < QA && a0 + a < count; ++a) {
      const __m256 scale = _mm256_set1_ps(inv[a0 + a]);
      for (int w = 0; w < W; ++w) _mm256_storeu_ps(out + (a0 + a) * width + 8 * w, _mm256_mul_ps(acc[a][w], scale));
    }
  }
}
#else
template <int D>
inline void load_queries(const float* q0, int64_t stride, int count, float scale, float* qt) {
  for (int c = 0; c < D; ++c)
    for (int a = 0; a < QB; ++a) qt[c * QB + a] = a < count ? q0[a * stride + c] * scale : 0.0f;
}

template <int D, int NB, int MODE>
inline void score_keys(const float* qt, const float* k0, int64_t stride, int64_t length, int64_t keys, float* st,
                       const float* rel, const float* kr, const float* qr, int64_t width) {
  for (int b = 0; b < NB; ++b)
    for (int64_t j = 0; j < length; ++j) {
      const float* k = k0 + j * stride;
      float acc[QB] = {};
      for (int c = 0; c < D; ++c)
        for (int a = 0; a < QB; ++a) {
          const float qa = qt[b * D * QB + c * QB + a];
          acc[a] += qa * k[c];
          if (MODE == kContent) {
            const int64_t at = c * width + b * QB + a - j;
            acc[a] += qa * kr[at];
            acc[a] += k[c] * qr[at];
          }
        }
      for (int a = 0; a < QB; ++a)
        st[b * keys * QB + j * QB + a] = MODE == kDistance ? acc[a] + rel[b * QB + a - j] : acc[a];
    }
}

inline void softmax_columns(float* st, int64_t length, float* inv) {
  for (int a = 0; a < QB; ++a) {
    float most = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) most = st[j * QB + a] > most ? st[j * QB + a] : most;
    float sum = 0.0f;
    for (int64_t j = 0; j < length; ++j) {
      st[j * QB + a] = exp_nonpositive(st[j * QB + a] - most);
      sum += st[j * QB + a];
    }
    inv[a] = 1.0f / sum;
  }
}

template <int D>
inline void weighted_values(const float* st, const float* inv, int64_t length, const float* v, int64_t stride,
                            int count, float* out, int64_t width) {
  for (int a = 0; a < count; ++a) {
    float acc[D] = {};
    for (int64_t j = 0; j < length; ++j)
      for (int c = 0; c < D; ++c) acc[c] += st[j * QB + a] * v[j * stride + c];
    for (int c = 0; c < D; ++c) out[a * width + c] = acc[c] * inv[a];
  }
}
#endif

// What a score adds besides q · k:
// - kDistance, a bias that depends on the distance query - key only (MPNet's relative positions, a
//   sliding window, a causal mask): query i against key j of head h adds TABLE[h * STRIDE + CENTRE +
//   i - j]. An entry may be -inf (a key outside the window or after the query): it weighs e^-87,
//   where the exp clamps, next to the query's own key, which must stay finite.
// - kContent, DeBERTa's disentangled attention: KEYS and QUERIES are [heads, D, WIDTH], column
//   CENTRE + i - j of head h holding that distance's relative key (c2p) and relative query (p2c,
//   already multiplied by the scale); query i against key j adds (scale * q_i) · KEYS[h, :, CENTRE +
//   i - j] + k_j · QUERIES[h, :, CENTRE + i - j].
// CAUSAL (kDistance): every key after its query weighs e^-87 at most (the table's entries for those
// distances are -inf), so a block of queries scores the keys up to its last query only: the keys it
// leaves out would add e^-87 ≈ 1.7e-38 to a sum that holds the query's own e^0 and to weighted
// values already larger (`varlen_attention_biased` says when).
struct Relative {
  const float* table;
  int64_t stride, centre;
  const float* keys;
  const float* queries;
  int64_t width;
  bool causal = false;
};

template <int D, int MODE>
void attend_row_head(const float* qkv, float* out, int64_t start, int64_t length, int64_t head, int64_t heads,
                     float scale, const Relative& relative, Scratch& scratch) {
  const int64_t stride = 3 * heads * D;  // one token's Q, K and V
  const int64_t width = heads * D;
  const int64_t keys = (length + KG - 1) / KG * KG;  // the last key group's padding
  scratch.queries_t.resize(static_cast<size_t>(2 * D * QB));
  scratch.scores.resize(static_cast<size_t>(2 * keys * QB));
  float* qt = scratch.queries_t.data();
  float* st = scratch.scores.data();
  const float* q = qkv + start * stride + head * D;
  float inv[QB];
  // two blocks of queries scored together while a row has more than one left (two query vectors
  // per key broadcast: fewer loads per multiply-add), then one block
  for (int64_t i0 = 0; i0 < length; i0 += 2 * QB) {
    const int blocks = length - i0 > QB ? 2 : 1;
    int count[2];  // queries in each block
    for (int b = 0; b < blocks; ++b) {
      count[b] = static_cast<int>(std::min<int64_t>(QB, length - i0 - b * QB));
      load_queries<D>(q + (i0 + b * QB) * stride, stride, count[b], scale, qt + b * D * QB);
    }
    const float* rel = MODE == kDistance ? relative.table + head * relative.stride + relative.centre + i0 : nullptr;
    const int64_t at = head * D * relative.width + relative.centre + i0;
    const float* kr = MODE == kContent ? relative.keys + at : nullptr;
    const float* qr = MODE == kContent ? relative.queries + at : nullptr;
    // the keys these blocks read: all of the row's, or under a causal table up to their last query
    const int64_t reach =
        MODE == kDistance && relative.causal ? std::min<int64_t>(length, i0 + count[0] + (blocks == 2 ? count[1] : 0))
                                             : length;
    if (blocks == 2) {
      score_keys<D, 2, MODE>(qt, q + width, stride, reach, keys, st, rel, kr, qr, relative.width);
    } else {
      score_keys<D, 1, MODE>(qt, q + width, stride, reach, keys, st, rel, kr, qr, relative.width);
    }
    for (int b = 0; b < blocks; ++b) {
      const int64_t first = i0 + b * QB;
      float* sb = st + b * keys * QB;
      softmax_columns(sb, reach, inv);
      weighted_values<D>(sb, inv, reach, q + 2 * width, stride, count[b], out + (start + first) * width + head * D,
                         width);
    }
  }
}

using Kernel = void (*)(const float*, float*, int64_t, int64_t, int64_t, int64_t, float, const Relative&, Scratch&);

// Head sizes a whole number of 512-bit vectors wide; smaller ones (8: measured 9x slower than
// SDPA here) keep the per-run SDPA.
template <int MODE>
Kernel kernel_for(int64_t dim) {
  switch (dim) {
    case 16: return attend_row_head<16, MODE>;
    case 32: return attend_row_head<32, MODE>;
    case 64: return attend_row_head<64, MODE>;
    case 80: return attend_row_head<80, MODE>;
    case 96: return attend_row_head<96, MODE>;
    case 128: return attend_row_head<128, MODE>;
    default: return nullptr;
  }
}

at::Tensor attend(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths, int64_t heads,
                  double scale, const Relative& relative);

}  // namespace

bool supports_head_dim(int64_t dim) { return kernel_for<kPlain>(dim) != nullptr; }

at::Tensor varlen_attention(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths,
                            int64_t heads, double scale) {
  return attend(qkv, starts, lengths, heads, scale, Relative{nullptr, 0, 0, nullptr, nullptr, 0});
}

namespace {

// The longest of LENGTHS, and whether distances from CENTRE - (its length rounded up to a key
// group - 1) to CENTRE + (rounded up to a query block - 1) fit a table WIDTH wide: the kernel
// reads its padded query blocks and key groups too.
int64_t longest_row(const at::Tensor& lengths) {
  const auto l = lengths.contiguous();
  const int64_t* lp = l.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < l.numel(); ++b) longest = std::max(longest, lp[b]);
  return longest;
}

bool covers(int64_t width, int64_t centre, int64_t longest) {
  return centre >= (longest + KG - 1) / KG * KG - 1 && width >= centre + (longest + QB - 1) / QB * QB;
}

// Whether every head's TABLE (rows SPAN wide, distance 0 at CENTRE) is -inf for every key after its
// query in rows of up to LONGEST tokens (distances -1 to -(LONGEST - 1)): a causal mask, maybe with
// more terms for the keys before the query (`Relative::causal`).
bool causal_table(const float* table, int64_t heads, int64_t span, int64_t centre, int64_t longest) {
  const float masked = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t d = 1; d < longest; ++d)
      if (table[h * span + centre - d] != masked) return false;
  return true;
}

}  // namespace

// The same with a bias of the distance (`Relative`): BIAS [heads, span] float32, CENTRE where
// distance 0 sits. The kernel reads it for the padded query blocks and key groups too, so CENTRE must be at
// least the longest row rounded up to a key group, minus 1, and SPAN at least CENTRE plus the
// longest row rounded up to a query block.
at::Tensor varlen_attention_biased(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths,
                                   int64_t heads, double scale, const at::Tensor& bias, int64_t centre) {
  TORCH_CHECK(bias.dim() == 2 && bias.size(0) == heads && bias.scalar_type() == at::kFloat && bias.is_contiguous(),
              "bias must be a contiguous float32 [heads, span] matrix");
  const int64_t longest = longest_row(lengths);
  TORCH_CHECK(covers(bias.size(1), centre, longest), "bias of span ", bias.size(1), " centred at ", centre,
              " does not cover rows of ", longest, " tokens");
  const float* table = bias.data_ptr<float>();
  const bool causal = causal_table(table, heads, bias.size(1), centre, longest);
  return attend(qkv, starts, lengths, heads, scale, Relative{table, bias.size(1), centre, nullptr, nullptr, 0, causal});
}

// DeBERTa's disentangled attention (`Relative`'s kContent): KEYS and QUERIES [heads, dim, width]
// float32, each column a distance's relative key / (scaled) relative query, CENTRE where distance 0
// sits, with the reach `varlen_attention_biased` asks of its table. SCALE multiplies q · k and
// the c2p term (DeBERTa's 1 / sqrt(dim * (1 + terms))).
at::Tensor varlen_attention_disentangled(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths,
                                         int64_t heads, double scale, const at::Tensor& keys,
                                         const at::Tensor& queries, int64_t centre) {
  const int64_t dim = qkv.size(1) / (3 * heads);
  for (const at::Tensor* t : {&keys, &queries})
    TORCH_CHECK(t->dim() == 3 && t->size(0) == heads && t->size(1) == dim && t->scalar_type() == at::kFloat &&
                    t->is_contiguous(),
                "relative keys and queries must be contiguous float32 [heads, ", dim, ", width] tensors");
  TORCH_CHECK(keys.size(2) == queries.size(2), "relative keys and queries of different widths");
  const int64_t longest = longest_row(lengths);
  TORCH_CHECK(covers(keys.size(2), centre, longest), "relative tables of width ", keys.size(2), " centred at ",
              centre, " do not cover rows of ", longest, " tokens");
  return attend(qkv, starts, lengths, heads, scale,
                Relative{nullptr, 0, centre, keys.data_ptr<float>(), queries.data_ptr<float>(), keys.size(2)});
}

namespace {

// qkv [rows_total, 3 * heads * dim] float32 contiguous; starts/lengths int64 [B] (each row's first
// token and length); returns [rows_total, heads * dim] with every token past the rows zeroed.
at::Tensor attend(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths, int64_t heads,
                  double scale, const Relative& relative) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(),
              "qkv must be a contiguous float32 [N, 3 * heads * dim] matrix");
  TORCH_CHECK(starts.scalar_type() == at::kLong && lengths.scalar_type() == at::kLong &&
                  starts.numel() == lengths.numel(),
              "starts and lengths must be int64 vectors of one size");
  const int64_t width = qkv.size(1) / 3;
  TORCH_CHECK(qkv.size(1) == 3 * width && width % heads == 0, "qkv width is not 3 * heads * dim");
  const int64_t dim = width / heads;
  const Kernel kernel = relative.keys != nullptr    ? kernel_for<kContent>(dim)
                        : relative.table != nullptr ? kernel_for<kDistance>(dim)
                                                    : kernel_for<kPlain>(dim);
  TORCH_CHECK(kernel != nullptr, "no kernel for head dim ", dim);
  auto out = at::empty({qkv.size(0), width}, qkv.options());
  const auto s = starts.contiguous();
  const auto l = lengths.contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t* lp = l.data_ptr<int64_t>();
  const int64_t rows = s.numel();
  int64_t end = 0;
  for (int64_t b = 0; b < rows; ++b) end = std::max(end, sp[b] + lp[b]);
  TORCH_CHECK(end <= qkv.size(0), "a row runs past the qkv matrix");
  if (end < qkv.size(0)) out.narrow(0, end, qkv.size(0) - end).zero_();
  const float* in = qkv.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, rows * heads, 1, [&](int64_t begin, int64_t stop) {
    Scratch scratch;
    for (int64_t task = begin; task < stop; ++task) {
      const int64_t b = task / heads;
      kernel(in, o, sp[b], lp[b], task % heads, heads, sc, relative, scratch);
    }
  });
  return out;
}

// One row of add + LayerNorm: X = D + R written into D, then D = (X - mean) / sqrt(var + eps) * W + B.
// The sums run over 16 lanes in a fixed order, so a row's bits depend on its own values only.
void add_norm_row(float* d, const float* r, const float* w, const float* b, int64_t h, float eps) {
  int64_t c = 0;
  float total = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; c + 16 <= h; c += 16) {
    const __m512 x = _mm512_add_ps(_mm512_loadu_ps(d + c), _mm512_loadu_ps(r + c));
    _mm512_storeu_ps(d + c, x);
    acc = _mm512_add_ps(acc, x);
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; c < h; ++c) {
    d[c] += r[c];
    total += d[c];
  }
  const float mean = total / static_cast<float>(h);
  float squares = 0.0f;
  c = 0;
#if defined(__AVX512F__)
  const __m512 m = _mm512_set1_ps(mean);
  __m512 sq = _mm512_setzero_ps();
  for (; c + 16 <= h; c += 16) {
    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(d + c), m);
    sq = _mm512_fmadd_ps(x, x, sq);
  }
  squares = _mm512_reduce_add_ps(sq);
#endif
  for (; c < h; ++c) squares += (d[c] - mean) * (d[c] - mean);
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(h) + eps);
  c = 0;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(inv);
  for (; c + 16 <= h; c += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(d + c), m), s);
    _mm512_storeu_ps(d + c, _mm512_fmadd_ps(x, _mm512_loadu_ps(w + c), _mm512_loadu_ps(b + c)));
  }
#endif
  for (; c < h; ++c) d[c] = (d[c] - mean) * inv * w[c] + b[c];
}

}  // namespace

// delta, residual [N, H] float32 contiguous, weight and bias [H]: delta <- LayerNorm(delta + residual)
// (in place: the caller's delta is a linear's fresh output); returns delta.
at::Tensor add_layer_norm_(at::Tensor& delta, const at::Tensor& residual, const at::Tensor& weight,
                           const at::Tensor& bias, double eps) {
  TORCH_CHECK(delta.dim() == 2 && delta.scalar_type() == at::kFloat && delta.is_contiguous(),
              "delta must be a contiguous float32 [N, H] matrix");
  TORCH_CHECK(residual.sizes() == delta.sizes() && residual.scalar_type() == at::kFloat && residual.is_contiguous(),
              "residual must be a contiguous float32 matrix of delta's shape");
  const int64_t h = delta.size(1);
  TORCH_CHECK(weight.numel() == h && bias.numel() == h && weight.scalar_type() == at::kFloat &&
                  bias.scalar_type() == at::kFloat && weight.is_contiguous() && bias.is_contiguous(),
              "weight and bias must be contiguous float32 vectors of H values");
  float* d = delta.data_ptr<float>();
  const float* r = residual.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, delta.size(0), 16, [&](int64_t begin, int64_t stop) {
    for (int64_t row = begin; row < stop; ++row) add_norm_row(d + row * h, r + row * h, w, b, h, e);
  });
  return delta;
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, c10::string_view attr,
                         c10::string_view algorithm) {
  static const auto linear = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(w);
  if (b.defined() && b.numel() > 0)
    stack.emplace_back(b);
  else
    stack.emplace_back(c10::IValue());  // no bias
  stack.emplace_back(std::string(attr));
  stack.emplace_back(c10::List<std::optional<c10::Scalar>>());
  stack.emplace_back(std::string(algorithm));
  linear.callBoxed(&stack);
  return stack[0].toTensor();
}

// Every layer of a BERT-like encoder in one call: per layer the packed qkv linear, the one-call
// attention, the output linear, residual add + LayerNorm, the feed-forward linears (the first with
// its fused activation) and add + LayerNorm again -- the same kernels, in the same order, as the
// Python loop (`bert.py` `packed_forward`), so the same bits. Called from Python it releases the
// GIL once for the whole stack instead of at every op: beside a busy event loop each reacquire
// waited up to a switch interval (about 240 of them a forward). PARAMS holds 12 tensors a layer:
// qkv weight/bias, output weight/bias, first norm weight/bias, ffn-in weight/bias, ffn-out
// weight/bias, second norm weight/bias (weights as `_reorder_linear_weight` packed them). BIAS:
// every layer's scores add that distance table (`varlen_attention_biased`, CENTRE its distance 0:
// MPNet's relative positions), or none when it is undefined or empty.
namespace {

at::Tensor layer_attention(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths, int64_t heads,
                           double scale, const at::Tensor& bias, int64_t centre) {
  if (bias.defined() && bias.numel() > 0)
    return varlen_attention_biased(qkv, starts, lengths, heads, scale, bias, centre);
  return varlen_attention(qkv, starts, lengths, heads, scale);
}

}  // namespace

at::Tensor packed_layers(const at::Tensor& x_in, const at::Tensor& starts, const at::Tensor& lengths,
                         const std::vector<at::Tensor>& params, int64_t heads, double scale,
                         const std::vector<double>& eps, c10::string_view ffn_attr, c10::string_view ffn_algorithm,
                         const at::Tensor& bias, int64_t centre) {
  TORCH_CHECK(params.size() % 12 == 0, "encoder_layers: 12 tensors a layer, got ", params.size());
  const size_t layers = params.size() / 12;
  TORCH_CHECK(eps.size() == 2 * layers, "encoder_layers: two norms' eps a layer");
  const auto& run_linear = packed_linear;
  at::Tensor x = x_in;
  for (size_t i = 0; i < layers; ++i) {
    const at::Tensor* p = params.data() + 12 * i;
    at::Tensor qkv = run_linear(x, p[0], p[1], "none", "").contiguous();
    at::Tensor attended = layer_attention(qkv, starts, lengths, heads, scale, bias, centre);
    at::Tensor delta = run_linear(attended, p[2], p[3], "none", "");
    x = add_layer_norm_(delta, x, p[4], p[5], eps[2 * i]);
    at::Tensor inner = run_linear(x, p[6], p[7], ffn_attr, ffn_algorithm);
    at::Tensor out = run_linear(inner, p[8], p[9], "none", "");
    x = add_layer_norm_(out, x, p[10], p[11], eps[2 * i + 1]);
  }
  return x;
}

// `packed_layers` with no distance table, as an op (the layer loop's one call, `VarlenOps.layers`).
at::Tensor encoder_layers(const at::Tensor& x, const at::Tensor& starts, const at::Tensor& lengths,
                          const std::vector<at::Tensor>& params, int64_t heads, double scale,
                          const std::vector<double>& eps, c10::string_view ffn_attr, c10::string_view ffn_algorithm) {
  return packed_layers(x, starts, lengths, params, heads, scale, eps, ffn_attr, ffn_algorithm, at::Tensor(), 0);
}

namespace {

// One int8 linear of an int8 package (engines/cpu_int8.py `Int8Linear`, the same ops in the same
// order, so the same bits): X's rows quantized per token (`srun_int8::quantize_tokens`, the int8
// row op, loaded before any int8 weights are built), oneDNN's u8 x s8 GEMM on the prepacked
// weight with its per-channel scales, the zero point's share removed and the step and bias
// applied (`srun_int8::finish_rows`), then ACT (ALGORITHM: gelu's approximation) in place on the
// first TOKENS rows: the Python loop activates exactly those, so the elementwise kernel splits its
// work the same way and gives the same bits on any thread count (the padding rows past TOKENS are
// never read back into a real row). P holds the prepacked weight, its scales, zero points (int32
// zeros), column sums and bias. X's row count is already a row bucket, so the GEMM runs on it as it is.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor* p, int64_t tokens, c10::string_view act,
                       c10::string_view algorithm) {
  static const auto quantize =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("srun_int8::quantize_tokens", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, int64_t)>();
  static const auto finish =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("srun_int8::finish_rows", "")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  static const auto gemm = c10::Dispatcher::singleton().findSchemaOrThrow("onednn::qlinear_pointwise", "");
  auto [codes, step, zero] = quantize.call(x.contiguous(), x.size(0));
  torch::jit::Stack stack;
  stack.reserve(13);
  stack.emplace_back(codes);
  stack.emplace_back(1.0);
  stack.emplace_back(int64_t{0});
  stack.emplace_back(p[0]);
  stack.emplace_back(p[1]);
  stack.emplace_back(p[2]);
  stack.emplace_back(c10::IValue());
  stack.emplace_back(1.0);
  stack.emplace_back(int64_t{0});
  stack.emplace_back(at::kFloat);
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<c10::Scalar>>());
  stack.emplace_back(std::string(""));
  gemm.callBoxed(&stack);
  at::Tensor acc = stack[0].toTensor();
  finish.call(acc, zero, step, p[3], p[4]);
  if (act == "none") return acc;
  at::Tensor real = acc.narrow(0, 0, tokens);
  if (act == "gelu") {
    at::gelu_(real, algorithm);
  } else if (act == "relu") {
    at::relu_(real);
  } else {
    TORCH_CHECK(act == "swish", "int8 linear: unknown activation ", std::string(act));
    at::silu_(real);
  }
  return acc;
}

// Every layer of a BERT-shaped int8 package in one call: `encoder_layers`' order with int8
// linears (the Python loop over `Int8Linear`s, so the same bits). PARAMS holds 24 tensors a
// layer: qkv (5, as `int8_linear` takes them), output (5), first norm weight/bias, ffn-in (5),
// ffn-out (5), second norm weight/bias. TOKENS: the real token rows at the top of X. BIAS, CENTRE:
// as `packed_layers` takes them.
at::Tensor int8_layers(const at::Tensor& x_in, int64_t tokens, const at::Tensor& starts, const at::Tensor& lengths,
                       const std::vector<at::Tensor>& params, int64_t heads, double scale,
                       const std::vector<double>& eps, c10::string_view ffn_act, c10::string_view ffn_algorithm,
                       const at::Tensor& bias, int64_t centre) {
  TORCH_CHECK(params.size() % 24 == 0, "int8_layers: 24 tensors a layer, got ", params.size());
  const size_t layers = params.size() / 24;
  TORCH_CHECK(eps.size() == 2 * layers, "int8_layers: two norms' eps a layer");
  at::Tensor x = x_in;
  for (size_t i = 0; i < layers; ++i) {
    const at::Tensor* p = params.data() + 24 * i;
    at::Tensor qkv = int8_linear(x, p, tokens, "none", "");
    at::Tensor attended = layer_attention(qkv, starts, lengths, heads, scale, bias, centre);
    at::Tensor delta = int8_linear(attended, p + 5, tokens, "none", "");
    x = add_layer_norm_(delta, x, p[10], p[11], eps[2 * i]);
    at::Tensor inner = int8_linear(x, p + 12, tokens, ffn_act, ffn_algorithm);
    at::Tensor out = int8_linear(inner, p + 17, tokens, "none", "");
    x = add_layer_norm_(out, x, p[22], p[23], eps[2 * i + 1]);
  }
  return x;
}

// A BERT-shaped encoder's weights, held by C++ for the whole forward (`encode`). Tensors that
// Python also holds carry a PyObject: every time a C++ reference to one is dropped and leaves only
// Python's, torch decrefs that PyObject, which takes the GIL. Arguments passed from Python are
// such references, dropped when the op returns, one GIL take each (72 a MiniLM forward through
// `encoder_layers`, each waiting up to a switch interval beside a busy event loop). Held here they
// are taken once, at load: a forward's own references never drop the count to Python's alone.
struct EncoderWeights : torch::CustomClassHolder {
  // embeddings: word, position and token-type tables, the LayerNorm's weight and bias
  at::Tensor word, position, type, norm_weight, norm_bias;
  double norm_eps;
  int64_t offset;  // the first position's row (RoBERTa numbers positions from pad_token_id + 1)
  bool int8;  // the layers' linears: packed FP32 (12 tensors a layer, as `encoder_layers` takes them)
              // or an int8 package's (24 a layer, as `int8_layers` takes them)
  std::vector<at::Tensor> params;
  int64_t heads;
  double scale;
  std::vector<double> eps;
  std::string ffn_attr, ffn_algorithm;
  // every layer's distance table (MPNet's relative positions for the model's longest row,
  // `varlen_attention_biased`), CENTRE its distance 0; empty for none
  at::Tensor bias;
  int64_t centre;

  EncoderWeights(std::vector<at::Tensor> embeddings, double norm_eps, int64_t offset, std::string linears,
                 std::vector<at::Tensor> params, int64_t heads, double scale, std::vector<double> eps,
                 std::string ffn_attr, std::string ffn_algorithm, at::Tensor bias, int64_t centre)
      : norm_eps(norm_eps), offset(offset), int8(linears == "int8"), params(std::move(params)), heads(heads),
        scale(scale), eps(std::move(eps)), ffn_attr(std::move(ffn_attr)), ffn_algorithm(std::move(ffn_algorithm)),
        bias(std::move(bias)), centre(centre) {
    TORCH_CHECK(this->bias.numel() == 0 || (this->bias.dim() == 2 && this->bias.size(0) == heads),
                "EncoderWeights: the distance table is [heads, span]");
    TORCH_CHECK(linears == "packed" || linears == "int8", "EncoderWeights: linears are 'packed' or 'int8'");
    TORCH_CHECK(embeddings.size() == 5, "EncoderWeights: word, position, type, norm weight, norm bias");
    for (const auto& t : embeddings)
      TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "EncoderWeights: contiguous float32 tables");
    word = embeddings[0];
    position = embeddings[1];
    type = embeddings[2];
    norm_weight = embeddings[3];
    norm_bias = embeddings[4];
    const int64_t h = word.size(1);
    TORCH_CHECK(position.size(1) == h && type.size(1) == h && norm_weight.numel() == h && norm_bias.numel() == h,
                "EncoderWeights: tables of different widths");
    const size_t per_layer = int8 ? 24 : 12;
    TORCH_CHECK(this->params.size() % per_layer == 0 && this->eps.size() == 2 * (this->params.size() / per_layer),
                "EncoderWeights: ", per_layer, " tensors and two eps a layer");
  }
};

enum Pooling : int64_t { kNone = 0, kCls = 1, kMean = 2 };

// OUT = V / max(|V|, 1e-12) over H values (F.normalize's), the sum of squares over 16 lanes in a
// fixed order.
void normalize_row(float* v, int64_t h) {
  int64_t c = 0;
  float squares = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; c + 16 <= h; c += 16) {
    const __m512 x = _mm512_loadu_ps(v + c);
    acc = _mm512_fmadd_ps(x, x, acc);
  }
  squares = _mm512_reduce_add_ps(acc);
#endif
  for (; c < h; ++c) squares += v[c] * v[c];
  const float norm = std::max(std::sqrt(squares), 1e-12f);
  for (c = 0; c < h; ++c) v[c] /= norm;
}

}  // namespace

// A whole forward of a BERT-shaped encoder in one call: the rows' token ids (IDS, back to back in
// the caller's order, LENGTHS tokens each; TYPES their token-type ids, or empty for all 0), padded
// with id 0 at position 0 to ROWS_TOTAL token rows (the linears' row bucket), embedded ((word +
// position) + type, then LayerNorm: the eager embedding's bits), every layer (`encoder_layers`),
// then POOLING: kNone returns the hidden states [ROWS_TOTAL, H]; kCls each row's first token and
// kMean the mean of its tokens, [B, H] in the caller's order, L2-normalized when NORMALIZE. The
// arguments are plain integers and the weights are held by C++ (`EncoderWeights`), so nothing in
// the call takes the GIL: a forward runs its whole length beside a busy event loop.
at::Tensor encode(const c10::intrusive_ptr<EncoderWeights>& w, c10::List<int64_t> ids, c10::List<int64_t> lengths,
                  c10::List<int64_t> types, int64_t rows_total, int64_t pooling, bool normalize) {
  const int64_t rows = static_cast<int64_t>(lengths.size());
  const int64_t tokens = static_cast<int64_t>(ids.size());
  TORCH_CHECK(rows > 0, "encode: no rows");
  TORCH_CHECK(types.empty() || static_cast<int64_t>(types.size()) == tokens, "encode: one type id a token, or none");
  TORCH_CHECK(rows_total >= tokens, "encode: rows_total below the token count");
  TORCH_CHECK(pooling == kNone || pooling == kCls || pooling == kMean, "encode: unknown pooling ", pooling);
  const int64_t h = w->word.size(1);
  const int64_t vocab = w->word.size(0), type_vocab = w->type.size(0);
  auto starts = at::empty({rows}, at::kLong);
  auto sizes = at::empty({rows}, at::kLong);
  std::vector<int64_t> position(static_cast<size_t>(tokens));
  int64_t* sp = starts.data_ptr<int64_t>();
  int64_t* lp = sizes.data_ptr<int64_t>();
  int64_t token = 0, longest = 0;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t n = lengths.get(b);
    TORCH_CHECK(n > 0 && token + n <= tokens, "encode: lengths do not add up to the ids");
    sp[b] = token;
    lp[b] = n;
    for (int64_t j = 0; j < n; ++j) position[static_cast<size_t>(token + j)] = j;
    token += n;
    longest = std::max(longest, n);
  }
  TORCH_CHECK(token == tokens, "encode: lengths do not add up to the ids");
  TORCH_CHECK(w->offset + longest <= w->position.size(0), "encode: a row of ", longest, " tokens exceeds the ",
              w->position.size(0) - w->offset, " positions of this model");
  auto x = at::empty({rows_total, h}, at::kFloat);
  float* xp = x.data_ptr<float>();
  const float* word = w->word.data_ptr<float>();
  const float* pos = w->position.data_ptr<float>();
  const float* typ = w->type.data_ptr<float>();
  for (int64_t i = 0; i < rows_total; ++i) {
    const int64_t id = i < tokens ? ids.get(i) : 0;
    const int64_t t = i < tokens && !types.empty() ? types.get(i) : 0;
    TORCH_CHECK(id >= 0 && id < vocab, "encode: token id ", id, " outside the vocabulary of ", vocab);
    TORCH_CHECK(t >= 0 && t < type_vocab, "encode: token type ", t, " outside the ", type_vocab, " types");
    const float* wr = word + id * h;
    const float* pr = pos + (w->offset + (i < tokens ? position[static_cast<size_t>(i)] : 0)) * h;
    const float* tr = typ + t * h;
    float* out = xp + i * h;
    for (int64_t c = 0; c < h; ++c) out[c] = (wr[c] + pr[c]) + tr[c];
  }
  x = at::layer_norm(x, {h}, w->norm_weight, w->norm_bias, w->norm_eps);
  if (w->int8)
    x = int8_layers(x, tokens, starts, sizes, w->params, w->heads, w->scale, w->eps, w->ffn_attr, w->ffn_algorithm,
                    w->bias, w->centre);
  else
    x = packed_layers(x, starts, sizes, w->params, w->heads, w->scale, w->eps, w->ffn_attr, w->ffn_algorithm,
                      w->bias, w->centre);
  if (pooling == kNone) return x;
  auto pooled = at::empty({rows, h}, at::kFloat);
  const float* hp = x.data_ptr<float>();
  float* po = pooled.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t stop) {
    for (int64_t b = begin; b < stop; ++b) {
      float* out = po + b * h;
      const float* first = hp + sp[b] * h;
      std::memcpy(out, first, sizeof(float) * static_cast<size_t>(h));  // cls: the first token
      if (pooling == kMean) {
        for (int64_t j = 1; j < lp[b]; ++j) {
          const float* row = first + j * h;
          for (int64_t c = 0; c < h; ++c) out[c] += row[c];
        }
        const float count = static_cast<float>(lp[b]);
        for (int64_t c = 0; c < h; ++c) out[c] /= count;
      }
      if (normalize) normalize_row(out, h);
    }
  });
  return pooled;
}

// The threads one at::parallel_for of TASKS tasks ran on: the forward's thread count where the
// library was built with OpenMP (`cpp_ops.BASE_FLAGS`), 1 where it was not, whatever the count
// (every parallel loop of these ops then runs on the calling thread alone).
int64_t parallel_threads(int64_t tasks) {
  std::mutex lock;
  std::vector<std::thread::id> seen;
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
    const std::lock_guard<std::mutex> hold(lock);
    if (std::find(seen.begin(), seen.end(), std::this_thread::get_id()) == seen.end()) {
      seen.push_back(std::this_thread::get_id());
    }
  });
  return static_cast<int64_t>(seen.size());
}

TORCH_LIBRARY(srun_cpu, m) {
  m.class_<EncoderWeights>("EncoderWeights")
      .def(torch::init<std::vector<at::Tensor>, double, int64_t, std::string, std::vector<at::Tensor>, int64_t,
                       double, std::vector<double>, std::string, std::string, at::Tensor, int64_t>());
  m.def(
      "encode(__torch__.torch.classes.srun_cpu.EncoderWeights weights, int[] ids, int[] lengths, int[] types, "
      "int rows_total, int pooling, bool normalize) -> Tensor",
      &encode);
  m.def(
      "encoder_layers(Tensor x, Tensor starts, Tensor lengths, Tensor[] params, int heads, float scale, "
      "float[] eps, str ffn_attr, str ffn_algorithm) -> Tensor",
      &encoder_layers);
  m.def("varlen_attention(Tensor qkv, Tensor starts, Tensor lengths, int heads, float scale) -> Tensor",
        &varlen_attention);
  m.def(
      "varlen_attention_biased(Tensor qkv, Tensor starts, Tensor lengths, int heads, float scale, Tensor bias, "
      "int centre) -> Tensor",
      &varlen_attention_biased);
  m.def(
      "varlen_attention_disentangled(Tensor qkv, Tensor starts, Tensor lengths, int heads, float scale, "
      "Tensor keys, Tensor queries, int centre) -> Tensor",
      &varlen_attention_disentangled);
  m.def("supports_head_dim(int dim) -> bool", &supports_head_dim);
  m.def("parallel_threads(int tasks) -> int", &parallel_threads);
  m.def("add_layer_norm_(Tensor(a!) delta, Tensor residual, Tensor weight, Tensor bias, float eps) -> Tensor(a!)",
        &add_layer_norm_);
}
