// The inner loop of causal attention for one (token, head): scores against
// n_kv cached K rows, softmax, the weighted sum of V rows — with AVX-512
// where the CPU has it (the scalar loop in kernels.cpp stays the reference).
#pragma once

#include <cstdint>

namespace minfer::cpu {

// True when attn_head_simd can run head_dim hd on this CPU.
bool attn_simd_supported(int64_t hd);

// q [hd]; k, v: the region bases (f32, or f16 when f16) with rows of kv_row
// elements, this head's slice at element offset `off`; s scratch [n_kv]; o
// [hd] is overwritten. As ggml: with an f16 cache q is rounded to f16 for the
// scores and the probabilities to f16 for the sum; the softmax sums each 16
// exponentials in float, then in double.
void attn_head_simd(bool f16, const float* q, const void* k, const void* v, int64_t kv_row,
                    int64_t off, int64_t n_kv, int64_t hd, float scale, float* s, float* o);

}  // namespace minfer::cpu
