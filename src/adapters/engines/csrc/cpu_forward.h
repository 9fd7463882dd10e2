// What the C++ files of the `srun_cpu` library share (engines/cpu_op_library.py builds them into one
// library): cpu_forward.cpp defines these, cpu_stacks.cpp calls them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>

// The one-call attention of every row (cpu_forward.cpp), plain and with a score bias of the distance.
at::Tensor varlen_attention(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths, int64_t heads,
                            double scale);

// The one-call attention of every row with a score bias of the distance query - key (cpu_forward.cpp).
at::Tensor varlen_attention_biased(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths,
                                   int64_t heads, double scale, const at::Tensor& bias, int64_t centre);

// The same with DeBERTa's two position terms, read from the layer's tables laid out by distance.
at::Tensor varlen_attention_disentangled(const at::Tensor& qkv, const at::Tensor& starts, const at::Tensor& lengths,
                                         int64_t heads, double scale, const at::Tensor& keys,
                                         const at::Tensor& queries, int64_t centre);

// DELTA <- LayerNorm(DELTA + RESIDUAL) in one pass, over DELTA (a linear's fresh output).
at::Tensor add_layer_norm_(at::Tensor& delta, const at::Tensor& residual, const at::Tensor& weight,
                           const at::Tensor& bias, double eps);

// oneDNN's linear on a weight `_reorder_linear_weight` packed (`cpu_onednn.PackedLinear.rows`):
// X [M, in] with M a row bucket, B the bias or an undefined / empty tensor for none, ATTR and
// ALGORITHM a fused activation ("none", "" for none).
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, c10::string_view attr,
                         c10::string_view algorithm);
