// The Gated DeltaNet steps gated_delta.cpp defines and the Qwen3.5 layer stack (qwen3_5_layers.cpp)
// calls: the same functions as the ops the Python layer loop calls, so the same bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <vector>

// SiLU(causal depthwise conv1d) of X [N, C] float32 under WEIGHT [C, K], rows of LENGTHS back to back,
// each continuing TAIL [R or 1, K - 1, C] (empty: zeros). Returns the output [N, C] and every row's new
// tail [R, K - 1, C].
std::tuple<at::Tensor, at::Tensor> causal_conv_rows(const at::Tensor& x, const at::Tensor& weight,
                                                    const std::vector<int64_t>& lengths, const at::Tensor& tail);

// The gated delta rule over rows of LENGTHS back to back: MIXED [N, 2 Hk Dk + Hv Dv] the convolution's
// output (queries, keys, values), G (log decay) and BETA [N, Hv], INITIAL [R or 1, Hv, Dk, Dv] (empty:
// zeros). Returns the output [N, Hv, Dv] and, with FINAL_STATE, each row's last state [R, Hv, Dk, Dv]
// (else an empty tensor).
std::tuple<at::Tensor, at::Tensor> gated_delta_rows(const at::Tensor& mixed, const at::Tensor& g,
                                                    const at::Tensor& beta, const std::vector<int64_t>& lengths,
                                                    const at::Tensor& initial, int64_t key_heads,
                                                    int64_t value_heads, int64_t key_dim, int64_t value_dim,
                                                    bool final_state);
