// Every layer of the Qwen3.5 text backbone and its final norm in one call (engines/cpu_hybrid.py),
// the same ATen ops in the same order as the Python layer loop (`Qwen35LM._run` over
// `qwen3_5_layers.Qwen35Layer`) on the same kernels (the convolution and the delta rule of
// gated_delta.cpp), so the same bits. Called from Python it gives up the GIL once for the whole
// stack instead of at every op.
//
// A Gated DeltaNet layer: zero-centred RMSNorm; in_proj_qkv, the causal convolution + SiLU
// (`causal_conv_rows`); beta = sigmoid(in_proj_b); g = -exp(A_log) softplus(in_proj_a + dt_bias);
// the rule (`gated_delta_rows`); the gated RMSNorm with in_proj_z's gate; out_proj; the residual
// add. A gated full-attention layer: the norm; q_proj (each head's query and output gate side by
// side), k_proj, v_proj; per-head zero-centred norms of q and k; the rotary tables on their first
// rotary dims; causal SDPA per group of rows of one length (or, continuing a shared state, the
// state attended once for every token and each row's own part merged by their log-sum-exps,
// `GatedAttention._split`); times sigmoid(gate); o_proj; the residual add. Then the MLP (norm, silu(gate)
// * up, down, residual add) in both kinds.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softplus.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "gated_delta.h"

namespace {

constexpr size_t kPerLayer = 16;  // tensors a layer (`Qwen35Weights`)
constexpr int64_t kLinear = 0, kFull = 1;

bool given(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

std::optional<at::Tensor> bias_of(const at::Tensor& t) { return given(t) ? std::optional<at::Tensor>(t) : std::nullopt; }

at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = at::Tensor()) {
  return at::linear(x, w, bias_of(b));
}

// `ZeroCenteredRMSNorm` on float32: x * rsqrt(mean(x^2) + eps), times (1 + weight).
at::Tensor zero_centred_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor normed = x.mul(x.pow(2).mean(-1, true).add(eps).rsqrt());
  return normed.mul(weight.add(1.0));
}

// `GatedRMSNorm` on float32: weight * (x * rsqrt(mean(x^2) + eps)), times silu(gate).
at::Tensor gated_norm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight, double eps) {
  at::Tensor normed = x.mul(x.pow(2).mean(-1, true).add(eps).rsqrt());
  return weight.mul(normed).mul(at::silu(gate));
}

// `qwen3_5_layers.rotate`: the first cos.size(-1) dims of X turned, the rest passed through.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t dim = cos.size(-1), half = dim / 2;
  at::Tensor turn = x.slice(-1, 0, dim), rest = x.slice(-1, dim);
  at::Tensor rotated = at::cat({turn.slice(-1, half).neg(), turn.slice(-1, 0, half)}, -1);
  return at::cat({turn.mul(cos).add(rotated.mul(sin)), rest}, -1);
}

// Rows by length, longest first (`GatedAttention._groups`), each group's token places [g, L].
std::vector<at::Tensor> groups(const std::vector<int64_t>& lengths) {
  std::map<int64_t, std::vector<int64_t>, std::greater<int64_t>> by;
  std::vector<int64_t> starts(lengths.size());
  int64_t at = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    starts[r] = at;
    at += lengths[r];
    by[lengths[r]].push_back(static_cast<int64_t>(r));
  }
  std::vector<at::Tensor> out;
  for (const auto& [length, rows] : by) {
    auto idx = at::empty({static_cast<int64_t>(rows.size()), length}, at::kLong);
    int64_t* p = idx.data_ptr<int64_t>();
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t j = 0; j < length; ++j) p[static_cast<int64_t>(i) * length + j] = starts[rows[i]] + j;
    out.push_back(idx);
  }
  return out;
}

}  // namespace

// The backbone's weights, held by C++ for every forward (a tensor passed from Python costs a GIL
// take when the op drops it). PARAMS: 16 tensors a layer. Both kinds: 0 the input norm's weight,
// 1 the post-attention norm's, 2-4 the MLP's gate, up and down weights. A Gated DeltaNet layer
// (KINDS 0): 5-8 in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, 9 the convolution's weight [C, K],
// 10 dt_bias, 11 A_log, 12 the gated norm's weight, 13 out_proj, 14-15 empty. A full-attention
// layer (KINDS 1): 5-12 q_proj, k_proj, v_proj and o_proj, each weight then bias (empty: none),
// 13-14 the q and k norms' weights, 15 empty. Every norm has EPS.
struct Qwen35Weights : torch::CustomClassHolder {
  std::vector<at::Tensor> params;
  std::vector<int64_t> kinds;
  int64_t heads, kv_heads, head_dim, key_heads, value_heads, key_dim, value_dim;
  double eps;
  at::Tensor final_norm;

  Qwen35Weights(std::vector<at::Tensor> params, std::vector<int64_t> kinds, std::vector<int64_t> shape, double eps,
                at::Tensor final_norm)
      : params(std::move(params)), kinds(std::move(kinds)), eps(eps), final_norm(std::move(final_norm)) {
    TORCH_CHECK(!this->kinds.empty() && this->params.size() == kPerLayer * this->kinds.size(),
                "Qwen35Weights: 16 tensors a layer, got ", this->params.size(), " for ", this->kinds.size(),
                " layers");
    for (int64_t kind : this->kinds)
      TORCH_CHECK(kind == kLinear || kind == kFull, "Qwen35Weights: a layer is 0 (linear) or 1 (full attention)");
    TORCH_CHECK(shape.size() == 7, "Qwen35Weights: the shape is heads, kv_heads, head_dim, key_heads, value_heads, ",
                "key_dim, value_dim");
    heads = shape[0];
    kv_heads = shape[1];
    head_dim = shape[2];
    key_heads = shape[3];
    value_heads = shape[4];
    key_dim = shape[5];
    value_dim = shape[6];
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "Qwen35Weights: kv_heads must divide heads");
    TORCH_CHECK(key_heads > 0 && value_heads % key_heads == 0, "Qwen35Weights: key heads must divide value heads");
    for (const auto& t : this->params)
      TORCH_CHECK(!given(t) || t.scalar_type() == at::kFloat, "Qwen35Weights: float32 tensors only");
    TORCH_CHECK(this->final_norm.dim() == 1 && this->final_norm.scalar_type() == at::kFloat,
                "Qwen35Weights: the final norm is a float32 vector");
  }
};

namespace {

// `GatedAttention._own_rows`: causal attention within each row.
at::Tensor own_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<int64_t>& lengths,
                    bool gqa) {
  auto causal = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    return at::scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), std::nullopt,
                                            0.0, true, std::nullopt, gqa)
        .transpose(1, 2);
  };
  if (lengths.size() == 1) return causal(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)).select(0, 0);
  at::Tensor out = at::empty_like(q);
  for (const auto& idx : groups(lengths)) out.index_put_({idx}, causal(q.index({idx}), k.index({idx}), v.index({idx})));
  return out;
}

// `GatedAttention._split`: [the state ; the row's own tokens causally], the state attended once for
// every token (GQA groups as batch heads), each row's own part per group of one length, the two
// merged by their log-sum-exps.
at::Tensor split(const at::Tensor& q, at::Tensor k, at::Tensor v, const std::vector<int64_t>& lengths,
                 const at::Tensor& state_k, const at::Tensor& state_v, int64_t heads, int64_t kv_heads) {
  const int64_t n = q.size(0), g = kv_heads, rep = heads / kv_heads, d = q.size(2);
  at::Tensor grouped = q.reshape({n, g, rep, d}).permute({1, 0, 2, 3}).reshape({1, g, n * rep, d});
  auto [out_s, lse_s] = at::_scaled_dot_product_flash_attention_for_cpu(grouped, state_k, state_v);
  out_s = out_s.reshape({g, n, rep, d}).permute({1, 0, 2, 3}).reshape({n, heads, d});
  lse_s = lse_s.reshape({g, n, rep}).permute({1, 0, 2}).reshape({n, heads});
  at::Tensor out_o = at::empty_like(q);
  at::Tensor lse_o = at::empty({n, heads}, q.options());
  if (rep > 1) {
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
  }
  for (const auto& idx : groups(lengths)) {
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        q.index({idx}).transpose(1, 2), k.index({idx}).transpose(1, 2), v.index({idx}).transpose(1, 2), 0.0, true);
    out_o.index_put_({idx}, o.transpose(1, 2));
    lse_o.index_put_({idx}, lse.transpose(1, 2));
  }
  at::Tensor weight = lse_s.sub(lse_o).sigmoid().unsqueeze(-1);
  return out_o.add(out_s.sub(out_o).mul(weight));
}

}  // namespace

// X [N, H] float32: the embedded tokens of rows of LENGTHS back to back; COS / SIN [N, 1, rotary
// dims] the rotary tables at each token's position. PREFIX: empty, or two tensors a layer that the
// rows continue (a shared state's: a Gated DeltaNet layer's tail [1, K-1, C] and recurrent state
// [1, value heads, Dk, Dv], a full layer's keys and values [1, kv heads, S, head_dim]). Returns the
// final-normed hidden states [N, H], then, with KEEP, two tensors a layer as PREFIX holds them, for
// every row (tails [R, K-1, C], states [R, ...], keys and values [1, kv heads, N, head_dim]).
std::vector<at::Tensor> qwen3_5_layers(const c10::intrusive_ptr<Qwen35Weights>& w, const at::Tensor& x_in,
                                       std::vector<int64_t> lengths, const at::Tensor& cos, const at::Tensor& sin,
                                       std::vector<at::Tensor> prefix, bool keep) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "qwen3_5_layers: x is a float32 [N, H] matrix");
  const int64_t n = x_in.size(0), layers = static_cast<int64_t>(w->kinds.size());
  int64_t tokens = 0;
  for (int64_t length : lengths) tokens += length;
  TORCH_CHECK(!lengths.empty() && tokens == n, "qwen3_5_layers: the rows' lengths add up to ", tokens, ", not to ", n);
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == n && cos.size(2) <= w->head_dim && cos.size(2) % 2 == 0 &&
                  sin.sizes() == cos.sizes(),
              "qwen3_5_layers: cos and sin are [N, 1, rotary dims]");
  TORCH_CHECK(prefix.empty() || static_cast<int64_t>(prefix.size()) == 2 * layers,
              "qwen3_5_layers: a prefix holds two tensors a layer");
  const bool continues = !prefix.empty();
  const int64_t h = w->heads, kvh = w->kv_heads, d = w->head_dim;
  std::vector<at::Tensor> out{at::Tensor()};
  at::Tensor x = x_in;
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* p = w->params.data() + kPerLayer * i;
    at::Tensor normed = zero_centred_norm(x, p[0], w->eps);
    at::Tensor mixed, first, second;  // the mixer's output, what the layer leaves for continuations
    if (w->kinds[i] == kLinear) {
      auto [conv, tail] = causal_conv_rows(project(normed, p[5]), p[9], lengths,
                                           continues ? prefix[2 * i] : at::Tensor());
      at::Tensor beta = project(normed, p[7]).sigmoid();
      at::Tensor g = p[11].exp().neg().mul(at::softplus(project(normed, p[8]).add(p[10]), 1.0, 20.0));
      auto [rule, state] = gated_delta_rows(conv, g, beta, lengths, continues ? prefix[2 * i + 1] : at::Tensor(),
                                            w->key_heads, w->value_heads, w->key_dim, w->value_dim, keep);
      at::Tensor z = project(normed, p[6]).reshape({n, w->value_heads, w->value_dim});
      mixed = project(gated_norm(rule, z, p[12], w->eps).reshape({n, -1}), p[13]);
      first = tail;
      second = state;
    } else {
      auto halves = project(normed, p[5], p[6]).view({n, h, 2 * d}).chunk(2, -1);
      at::Tensor q = rotate(zero_centred_norm(halves[0], p[13], w->eps), cos, sin);
      at::Tensor k = rotate(zero_centred_norm(project(normed, p[7], p[8]).view({n, kvh, d}), p[14], w->eps), cos, sin);
      at::Tensor v = project(normed, p[9], p[10]).view({n, kvh, d});
      at::Tensor attended = continues ? split(q, k, v, lengths, prefix[2 * i], prefix[2 * i + 1], h, kvh)
                                      : own_rows(q, k, v, lengths, h != kvh);
      at::Tensor gated = attended.reshape({n, -1}).mul(halves[1].reshape({n, -1}).sigmoid());
      mixed = project(gated, p[11], p[12]);
      first = k.transpose(0, 1).unsqueeze(0);
      second = v.transpose(0, 1).unsqueeze(0);
    }
    x = x.add(mixed);
    at::Tensor inner = zero_centred_norm(x, p[1], w->eps);
    x = x.add(project(at::silu(project(inner, p[2])).mul(project(inner, p[3])), p[4]));
    if (keep) {
      out.push_back(first);
      out.push_back(second);
    }
  }
  out[0] = zero_centred_norm(x, w->final_norm, w->eps);
  return out;
}

TORCH_LIBRARY_FRAGMENT(srun_cpu, m) {
  m.class_<Qwen35Weights>("Qwen35Weights")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<int64_t>, double, at::Tensor>());
  m.def(
      "qwen3_5_layers(__torch__.torch.classes.srun_cpu.Qwen35Weights weights, Tensor x, int[] lengths, Tensor cos, "
      "Tensor sin, Tensor[] prefix, bool keep) -> Tensor[]",
      &qwen3_5_layers);
}
