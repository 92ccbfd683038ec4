// Causal multi-head self-attention on the CPU: the attention and attention_backward entries of
// the CPU's model operations (sapipe/nn.h gives the maths and the contract).
#pragma once

#include <cstddef>

#include "sapipe/status.h"

namespace sapipe::cpu {

sapipe_status attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, size_t batch, size_t seq,
                                size_t heads, size_t head_dim, float scale);
sapipe_status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                 const float* o, const float* lse, size_t batch, size_t seq, size_t heads, size_t head_dim, float scale);

}  // namespace sapipe::cpu
