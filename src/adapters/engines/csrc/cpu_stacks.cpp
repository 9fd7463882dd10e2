// Every layer of an encoder and its final norm in one call, for architectures whose layers are
// not BERT's (engines/cpu_stacks.py): the same ATen ops, in the same order, as their Python layer
// loops, so the same bits. Called from Python a stack gives up the GIL once instead of at every op:
// beside a busy event loop each take-back waits up to a switch interval, and a layer makes about
// 20-30 of them (`bench/forward_beside_loop.py --arch qwen3`).
//
// `decoder_layers`: a decoder backbone served as an encoder (Qwen3 / Qwen2 / Llama embedders and
// rerankers, `DecoderEncoder.packed_forward`). Per layer: RMSNorm, the packed qkv linear, q / k / v
// split into heads, q and k normed per head (Qwen3) and turned by the rotary tables, K / V
// repeated for grouped-query attention, the one-call attention with the causal mask as a bias of
// the distance (`varlen_attention_biased`), the output linear and the residual add; RMSNorm, the
// packed gate/up linear, silu(gate) * up, the down linear and the residual add.
//
// `modernbert_layers`: ModernBERT (`ModernBertEncoder.packed_forward`). Per layer: LayerNorm (none
// on the first layer), the packed qkv linear, q and k turned by the global or the local rotary
// tables, the one-call attention (a sliding layer with its window as a bias of the distance where
// the longest row passes it), the output linear and the residual add; LayerNorm, the packed input
// linear, act(a) * g over its two halves, the output linear and the residual add.
//
// `deberta_layers`: DeBERTa-v2/v3 with relative attention (`DebertaV2Encoder.packed_forward`), a
// post-norm BERT-shaped block per layer (`encoder_layers`' linears, add + LayerNorm and order)
// whose attention adds the disentangled position terms (`varlen_attention_disentangled`, the
// layer's tables for the width the forward's longest row needs, held with the weights).
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/stack.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu_forward.h"

namespace {

constexpr size_t kPerLayer = 12;  // tensors a layer (`DecoderWeights`)
constexpr size_t kEpsPerLayer = 4;

bool given(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// `decoder.RMSNorm.forward` on float32: x * rsqrt(mean(x^2) + eps), then weight * that.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor normed = x.mul(x.pow(2).mean(-1, true).add(eps).rsqrt());
  return weight.mul(normed);
}

// `decoder.apply_rotary` and `modernbert.rotate` on float32: x * cos + (the halves of x swapped,
// the second negated) * sin.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor turned = at::cat({x.slice(-1, half).neg(), x.slice(-1, 0, half)}, -1);
  return x.mul(cos).add(turned.mul(sin));
}

}  // namespace

// A decoder backbone's weights, held by C++ for every forward (as `EncoderWeights`: a tensor passed
// from Python costs a GIL take when the op drops it). PARAMS holds 12 tensors a layer: the input
// norm's weight, qkv's packed weight and bias, the per-head q and k norms' weights, the output
// linear's packed weight and bias, the post-attention norm's weight, gate/up's packed weight and
// bias, down's packed weight and bias (a bias or a per-head norm the model lacks is an empty
// tensor). EPS: four a layer (input, q, k and post-attention norms).
struct DecoderWeights : torch::CustomClassHolder {
  std::vector<at::Tensor> params;
  std::vector<double> eps;
  int64_t heads, kv_heads, head_dim, intermediate;
  at::Tensor final_norm;
  double final_eps;

  DecoderWeights(std::vector<at::Tensor> params, std::vector<double> eps, int64_t heads, int64_t kv_heads,
                 int64_t head_dim, int64_t intermediate, at::Tensor final_norm, double final_eps)
      : params(std::move(params)), eps(std::move(eps)), heads(heads), kv_heads(kv_heads), head_dim(head_dim),
        intermediate(intermediate), final_norm(std::move(final_norm)), final_eps(final_eps) {
    TORCH_CHECK(!this->params.empty() && this->params.size() % kPerLayer == 0,
                "DecoderWeights: 12 tensors a layer, got ", this->params.size());
    TORCH_CHECK(this->eps.size() == kEpsPerLayer * (this->params.size() / kPerLayer),
                "DecoderWeights: four eps a layer");
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "DecoderWeights: kv_heads must divide heads");
    TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "DecoderWeights: the rotary tables need an even head size");
    TORCH_CHECK(this->final_norm.dim() == 1 && this->final_norm.scalar_type() == at::kFloat,
                "DecoderWeights: the final norm is a float32 vector");
  }

  size_t layers() const { return params.size() / kPerLayer; }
};

// X [N, H] float32: the embedded tokens of the rows back to back (N a row bucket, the padding rows
// after them), STARTS / LENGTHS each row's first token and length, COS / SIN [N, 1, head_dim] the
// rotary tables at each token's position, CAUSAL [heads, span] the causal mask as a bias of the
// distance (`unpadded.RelativeBias.causal`, CENTRE its distance 0). Returns the final-normed
// hidden states [N, H]; with KEEP (int64 [K], K a row bucket: token indices, repeats allowed), only
// those tokens' [K, H]: the last layer's attention still reads every token's keys and values, and
// its output linear, feed-forward and the final norm run on the KEEP rows only (a decision reads
// each row's last token; `DecoderEncoder.packed_forward` does the same in its loop).
at::Tensor decoder_layers(const c10::intrusive_ptr<DecoderWeights>& w, const at::Tensor& x_in, const at::Tensor& starts,
                          const at::Tensor& lengths, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& causal, int64_t centre, const std::optional<at::Tensor>& keep) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "decoder_layers: x is a float32 [N, H] matrix");
  const int64_t n = x_in.size(0), d = w->head_dim;
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == n && cos.size(2) == d && sin.sizes() == cos.sizes(),
              "decoder_layers: cos and sin are [N, 1, head_dim]");
  if (keep.has_value()) {
    TORCH_CHECK(keep->dim() == 1 && keep->scalar_type() == at::kLong && keep->numel() > 0,
                "decoder_layers: keep is a non-empty int64 vector of token indices");
    TORCH_CHECK(keep->min().item<int64_t>() >= 0 && keep->max().item<int64_t>() < n,
                "decoder_layers: keep holds an index outside the ", n, " tokens");
  }
  const std::vector<int64_t> sizes{w->heads * d, w->kv_heads * d, w->kv_heads * d};
  const int64_t rep = w->heads / w->kv_heads;
  const double scale = std::pow(static_cast<double>(d), -0.5);
  at::Tensor x = x_in;
  for (size_t i = 0; i < w->layers(); ++i) {
    const at::Tensor* p = w->params.data() + kPerLayer * i;
    const double* eps = w->eps.data() + kEpsPerLayer * i;
    at::Tensor y = packed_linear(rms_norm(x, p[0], eps[0]), p[1], p[2], "none", "");
    auto parts = y.split_with_sizes(sizes, -1);
    at::Tensor q = parts[0].reshape({n, w->heads, d});
    at::Tensor k = parts[1].reshape({n, w->kv_heads, d});
    at::Tensor v = parts[2].reshape({n, w->kv_heads, d});
    if (given(p[3]) && given(p[4])) {
      q = rms_norm(q, p[3], eps[1]);
      k = rms_norm(k, p[4], eps[2]);
    }
    q = rotate(q, cos, sin);
    k = rotate(k, cos, sin);
    if (rep > 1) {  // grouped-query attention: each K/V head serves REP query heads
      k = k.repeat_interleave(rep, 1);
      v = v.repeat_interleave(rep, 1);
    }
    at::Tensor qkv = at::cat({q.reshape({n, -1}), k.reshape({n, -1}), v.reshape({n, -1})}, 1);
    at::Tensor attended = varlen_attention_biased(qkv.contiguous(), starts, lengths, w->heads, scale, causal, centre);
    if (keep.has_value() && i + 1 == w->layers()) {  // the last layer: only the KEEP tokens go on
      attended = attended.index_select(0, *keep);
      x = x.index_select(0, *keep);
    }
    x = x.add(packed_linear(attended, p[5], p[6], "none", ""));
    at::Tensor gate_up = packed_linear(rms_norm(x, p[7], eps[3]), p[8], p[9], "none", "");
    auto halves = gate_up.split(w->intermediate, -1);
    at::Tensor unit = at::silu(halves[0]).mul(halves[1]);
    x = x.add(packed_linear(unit, p[10], p[11], "none", ""));
  }
  return rms_norm(x, w->final_norm, w->final_eps);
}

namespace {

// An `encoder_parts.ACTIVATIONS` entry by name (`ModernBertWeights` checks it).
at::Tensor activate(const at::Tensor& x, const std::string& act) {
  if (act == "gelu") return at::gelu(x);
  if (act == "gelu_tanh") return at::gelu(x, "tanh");
  if (act == "relu") return at::relu(x);
  return at::silu(x);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  const std::optional<at::Tensor> b = given(bias) ? std::optional<at::Tensor>(bias) : std::nullopt;
  return at::layer_norm(x, {x.size(-1)}, weight, b, eps);
}

}  // namespace

// ModernBERT's weights, held by C++ (as `DecoderWeights`). PARAMS: 12 tensors a layer: the
// attention norm's weight and bias (an empty weight: no norm, the first layer), qkv's packed weight
// and bias, the output linear's packed weight and bias, the feed-forward norm's weight and bias,
// the input linear's packed weight and bias, the output linear's packed weight and bias (an empty
// bias: none). EPS: two a layer. GLOBAL: 1 where a layer attends everywhere (the global rotary
// tables), 0 for a sliding layer (the local tables, and the window). ACT: the gated unit's
// activation ("gelu", "gelu_tanh", "relu", "silu").
struct ModernBertWeights : torch::CustomClassHolder {
  std::vector<at::Tensor> params;
  std::vector<double> eps;
  std::vector<int64_t> global;
  int64_t heads;
  std::string act;
  at::Tensor final_weight, final_bias;
  double final_eps;

  ModernBertWeights(std::vector<at::Tensor> params, std::vector<double> eps, std::vector<int64_t> global,
                    int64_t heads, std::string act, at::Tensor final_weight, at::Tensor final_bias, double final_eps)
      : params(std::move(params)), eps(std::move(eps)), global(std::move(global)), heads(heads), act(std::move(act)),
        final_weight(std::move(final_weight)), final_bias(std::move(final_bias)), final_eps(final_eps) {
    TORCH_CHECK(!this->params.empty() && this->params.size() % kPerLayer == 0,
                "ModernBertWeights: 12 tensors a layer, got ", this->params.size());
    const size_t layers = this->params.size() / kPerLayer;
    TORCH_CHECK(this->eps.size() == 2 * layers && this->global.size() == layers,
                "ModernBertWeights: two eps and one global flag a layer");
    TORCH_CHECK(heads > 0, "ModernBertWeights: heads must be positive");
    TORCH_CHECK(this->act == "gelu" || this->act == "gelu_tanh" || this->act == "relu" || this->act == "silu",
                "ModernBertWeights: unknown activation ", this->act);
  }
};

// X [N, H] float32: the embedded (and normed) tokens of the rows back to back, N a row bucket;
// STARTS / LENGTHS each row's first token and length; GLOBAL_COS / GLOBAL_SIN and LOCAL_COS /
// LOCAL_SIN [N, 1, head_dim] the two rotary tables at each token's position; WINDOW [heads, span]
// the sliding layers' window as a bias of the distance (`unpadded.RelativeBias.window`, CENTRE
// its distance 0), or an empty tensor where the longest row fits in the window. Returns the
// final-normed hidden states [N, H].
at::Tensor modernbert_layers(const c10::intrusive_ptr<ModernBertWeights>& w, const at::Tensor& x_in,
                             const at::Tensor& starts, const at::Tensor& lengths, const at::Tensor& global_cos,
                             const at::Tensor& global_sin, const at::Tensor& local_cos, const at::Tensor& local_sin,
                             const at::Tensor& window, int64_t centre) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "modernbert_layers: x is a float32 [N, H] matrix");
  const int64_t n = x_in.size(0), h = x_in.size(1), d = h / w->heads;
  for (const auto* t : {&global_cos, &global_sin, &local_cos, &local_sin})
    TORCH_CHECK(t->dim() == 3 && t->size(0) == n && t->size(2) == d,
                "modernbert_layers: the rotary tables are [N, 1, head_dim]");
  const double scale = std::pow(static_cast<double>(d), -0.5);
  at::Tensor x = x_in;
  for (size_t i = 0; i < w->global.size(); ++i) {
    const at::Tensor* p = w->params.data() + kPerLayer * i;
    const double* eps = w->eps.data() + 2 * i;
    const bool global = w->global[i] != 0;
    const at::Tensor& cos = global ? global_cos : local_cos;
    const at::Tensor& sin = global ? global_sin : local_sin;
    at::Tensor normed = given(p[0]) ? layer_norm(x, p[0], p[1], eps[0]) : x;
    at::Tensor qkv = packed_linear(normed, p[2], p[3], "none", "").view({n, 3, w->heads, d});
    at::Tensor q = rotate(qkv.select(1, 0), cos, sin);
    at::Tensor k = rotate(qkv.select(1, 1), cos, sin);
    at::Tensor rows = at::stack({q, k, qkv.select(1, 2)}, 1).view({n, 3 * h}).contiguous();
    at::Tensor attended = !global && given(window)
                              ? varlen_attention_biased(rows, starts, lengths, w->heads, scale, window, centre)
                              : varlen_attention(rows, starts, lengths, w->heads, scale);
    x = x.add(packed_linear(attended, p[4], p[5], "none", ""));
    at::Tensor inner = packed_linear(layer_norm(x, p[6], p[7], eps[1]), p[8], p[9], "none", "");
    auto halves = inner.chunk(2, -1);
    at::Tensor unit = activate(halves[0], w->act).mul(halves[1]);
    x = x.add(packed_linear(unit, p[10], p[11], "none", ""));
  }
  return layer_norm(x, w->final_weight, w->final_bias, w->final_eps);
}

// DeBERTa's weights and position tables, held by C++ (as `DecoderWeights`). PARAMS: 12 tensors a
// layer as `encoder_layers` takes them; EPS: two a layer; SCALES: each layer's score scale
// (1 / sqrt(head_dim * (1 + terms))); KEYS / QUERIES: each layer's tables [heads, head_dim, width]
// (`unpadded.DisentangledTables`), CENTRE their distance 0; FFN_ATTR / FFN_ALGORITHM the first
// feed-forward linear's fused activation.
struct DebertaWeights : torch::CustomClassHolder {
  std::vector<at::Tensor> params;
  std::vector<double> eps, scales;
  std::vector<at::Tensor> keys, queries;
  int64_t heads, centre;
  std::string ffn_attr, ffn_algorithm;

  DebertaWeights(std::vector<at::Tensor> params, std::vector<double> eps, std::vector<double> scales,
                 std::vector<at::Tensor> keys, std::vector<at::Tensor> queries, int64_t heads, int64_t centre,
                 std::string ffn_attr, std::string ffn_algorithm)
      : params(std::move(params)), eps(std::move(eps)), scales(std::move(scales)), keys(std::move(keys)),
        queries(std::move(queries)), heads(heads), centre(centre), ffn_attr(std::move(ffn_attr)),
        ffn_algorithm(std::move(ffn_algorithm)) {
    TORCH_CHECK(!this->params.empty() && this->params.size() % kPerLayer == 0,
                "DebertaWeights: 12 tensors a layer, got ", this->params.size());
    const size_t layers = this->params.size() / kPerLayer;
    TORCH_CHECK(this->eps.size() == 2 * layers && this->scales.size() == layers && this->keys.size() == layers &&
                    this->queries.size() == layers,
                "DebertaWeights: two eps, a scale and two tables a layer");
    TORCH_CHECK(heads > 0, "DebertaWeights: heads must be positive");
  }
};

// X [N, H] float32: the embedded tokens of the rows back to back, N a row bucket; STARTS /
// LENGTHS each row's first token and length. Returns the last hidden states [N, H].
at::Tensor deberta_layers(const c10::intrusive_ptr<DebertaWeights>& w, const at::Tensor& x_in,
                          const at::Tensor& starts, const at::Tensor& lengths) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "deberta_layers: x is a float32 [N, H] matrix");
  at::Tensor x = x_in;
  for (size_t i = 0; i < w->scales.size(); ++i) {
    const at::Tensor* p = w->params.data() + kPerLayer * i;
    at::Tensor qkv = packed_linear(x, p[0], p[1], "none", "").contiguous();
    at::Tensor attended = varlen_attention_disentangled(qkv, starts, lengths, w->heads, w->scales[i], w->keys[i],
                                                        w->queries[i], w->centre);
    at::Tensor delta = packed_linear(attended, p[2], p[3], "none", "");
    x = add_layer_norm_(delta, x, p[4], p[5], w->eps[2 * i]);
    at::Tensor inner = packed_linear(x, p[6], p[7], w->ffn_attr, w->ffn_algorithm);
    at::Tensor out = packed_linear(inner, p[8], p[9], "none", "");
    x = add_layer_norm_(out, x, p[10], p[11], w->eps[2 * i + 1]);
  }
  return x;
}

TORCH_LIBRARY_FRAGMENT(srun_cpu, m) {
  m.class_<DecoderWeights>("DecoderWeights")
      .def(torch::init<std::vector<at::Tensor>, std::vector<double>, int64_t, int64_t, int64_t, int64_t, at::Tensor,
                       double>());
  m.def(
      "decoder_layers(__torch__.torch.classes.srun_cpu.DecoderWeights weights, Tensor x, Tensor starts, "
      "Tensor lengths, Tensor cos, Tensor sin, Tensor causal, int centre, Tensor? keep=None) -> Tensor",
      &decoder_layers);
  m.class_<ModernBertWeights>("ModernBertWeights")
      .def(torch::init<std::vector<at::Tensor>, std::vector<double>, std::vector<int64_t>, int64_t, std::string,
                       at::Tensor, at::Tensor, double>());
  m.def(
      "modernbert_layers(__torch__.torch.classes.srun_cpu.ModernBertWeights weights, Tensor x, Tensor starts, "
      "Tensor lengths, Tensor global_cos, Tensor global_sin, Tensor local_cos, Tensor local_sin, Tensor window, "
      "int centre) -> Tensor",
      &modernbert_layers);
  m.class_<DebertaWeights>("DebertaWeights")
      .def(torch::init<std::vector<at::Tensor>, std::vector<double>, std::vector<double>, std::vector<at::Tensor>,
                       std::vector<at::Tensor>, int64_t, int64_t, std::string, std::string>());
  m.def(
      "deberta_layers(__torch__.torch.classes.srun_cpu.DebertaWeights weights, Tensor x, Tensor starts, "
      "Tensor lengths) -> Tensor",
      &deberta_layers);
}
