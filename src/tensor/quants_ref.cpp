// Reference quantizers: the algorithms of ggml's quantize_row_*_ref (and, for
// IQ4_NL / IQ4_XS, quantize_iq4_nl / quantize_iq4_xs without an importance
// matrix, which is what llama.cpp's quantizer runs). The float operations are
// kept in ggml's order so that the produced bytes match ggml's.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/quants_impl.h"

namespace minfer::tensor::detail {

namespace {

// Below this a group is treated as all zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// ---- the scale searches shared by the K-quants -----------------------------

// The value of largest magnitude with its sign (the first one on ties, as
// ggml's loops keep it) and that magnitude: the reference quantizers map it
// to the end of the quantized range.
struct SignedAbsMax {
    float max;
    float amax;
};
inline SignedAbsMax signed_absmax(const float* x, int64_t n) {
    SignedAbsMax r{0.0f, 0.0f};
    for (int64_t i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > r.amax) {
            r.amax = ax;
            r.max = x[i];
        }
    }
    return r;
}

// The smallest and largest of n values (the asymmetric types' range).
struct MinMax {
    float min, max;
};
inline MinMax min_max(const float* x, int64_t n) {
    MinMax r{FLT_MAX, -FLT_MAX};
    for (int64_t i = 0; i < n; ++i) {
        if (x[i] < r.min) r.min = x[i];
        if (x[i] > r.max) r.max = x[i];
    }
    return r;
}

// Symmetric quantization of n values to [-nmax, nmax-1] (stored + nmax in L).
// rmse_type 1: weights x^2 (or qw), then a search over 18 nearby scales for
// the one minimizing the weighted squared error. Returns the scale.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type, const float* qw) {
    const auto [max, amax] = signed_absmax(x, n);
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; ++i) {
            const int l = nearest_int(iscale * x[i]);
            L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
        }
        return 1 / iscale;
    }
    bool return_early = false;
    if (rmse_type < 0) {
        rmse_type = -rmse_type;
        return_early = true;
    }
    auto weight = [&](int i) -> float {
        return qw               ? qw[i]
               : rmse_type == 1 ? x[i] * x[i]
               : rmse_type == 2 ? 1
               : rmse_type == 3 ? std::fabs(x[i])
                                : std::sqrt(std::fabs(x[i]));
    };
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = std::max(-nmax, std::min(nmax - 1, l));
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = weight(i);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = std::max(-nmax, std::min(nmax - 1, l));
            const float w = weight(i);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q3_K's symmetric search: start from round(x * -nmax/max), then coordinate
// descent on each quant (weights x^2) while the weighted fit improves.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse) {
    const auto [max, amax] = signed_absmax(x, n);
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    if (do_rmse) {
        float sumlx = 0, suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = std::max(-nmax, std::min(nmax - 1, l));
            L[i] = static_cast<int8_t>(l);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        for (int itry = 0; itry < 5; ++itry) {
            int n_changed = 0;
            for (int i = 0; i < n; ++i) {
                const float w = x[i] * x[i];
                float slx = sumlx - w * x[i] * L[i];
                if (slx > 0) {
                    float sl2 = suml2 - w * L[i] * L[i];
                    int new_l = nearest_int(x[i] * sl2 / slx);
                    new_l = std::max(-nmax, std::min(nmax - 1, new_l));
                    if (new_l != L[i]) {
                        slx += w * x[i] * new_l;
                        sl2 += w * new_l * new_l;
                        if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                            L[i] = static_cast<int8_t>(new_l);
                            sumlx = slx;
                            suml2 = sl2;
                            ++n_changed;
                        }
                    }
                }
            }
            if (!n_changed) break;
        }
        for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
        return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
    }
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = std::max(-nmax, std::min(nmax - 1, l));
        L[i] = static_cast<int8_t>(l + nmax);
    }
    return 1 / iscale;
}

// Asymmetric (scale, min) fit of n values to [0, nmax]: x ~ scale*L - the_min.
// Tries nstep+1 scales (rmin + rdelta*is + nmax)/(max - min), each followed by
// a weighted least-squares solve for (scale, min), and keeps the best by
// weighted squared (or absolute, use_mad) error.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = std::max(0, std::min(nmax, l));
            Laux[i] = static_cast<uint8_t>(l);
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? std::fabs(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// Index of the grid value nearest to x in the sorted grid val[0..n) (n a
// power of two); at an exact midpoint the upper value wins. Comparing 2x with
// val[j-1] + val[j] keeps both sides exact.
int best_index_int8(int n, const int8_t* val, float x) {
    const float x2 = x + x;
    int idx = 0;
    for (int step = n >> 1; step > 0; step >>= 1) {
        const int j = idx + step;
        idx = (x2 >= static_cast<float>(val[j - 1] + val[j])) ? j : idx;
    }
    return idx;
}

// Q4_K / Q5_K: pack 8 (6-bit scale, 6-bit min) pairs into 12 bytes.
void pack_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* scales) {
    if (j < 4) {
        scales[j] = ls;
        scales[j + 4] = lm;
    } else {
        scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
        scales[j - 4] |= ((ls >> 4) << 6);
        scales[j - 0] |= ((lm >> 4) << 6);
    }
}

}  // namespace

// ---- 32-element blocks -----------------------------------------------------

void quantize_q4_0(const float* x, block_q4_0* y, int64_t n) {
    constexpr int qk = QK4_0;
    const int64_t nb = n / qk;
    for (int64_t i = 0; i < nb; ++i) {
        // The element of largest magnitude maps exactly to -8 (its sign kept
        // in d), which uses the asymmetric 4-bit range [-8, 7] fully.
        const auto [max, amax] = signed_absmax(x + i * qk, qk);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = x[i * qk + 0 + j] * id;
            const float x1 = x[i * qk + qk / 2 + j] * id;
            const uint8_t xi0 = static_cast<uint8_t>(std::min(15, (int)(int8_t)(x0 + 8.5f)));
            const uint8_t xi1 = static_cast<uint8_t>(std::min(15, (int)(int8_t)(x1 + 8.5f)));
            y[i].qs[j] = xi0 | static_cast<uint8_t>(xi1 << 4);
        }
    }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t n) {
    constexpr int qk = QK4_1;
    const int64_t nb = n / qk;
    for (int64_t i = 0; i < nb; ++i) {
        const auto [min, max] = min_max(x + i * qk, qk);
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = (x[i * qk + 0 + j] - min) * id;
            const float x1 = (x[i * qk + qk / 2 + j] - min) * id;
            const uint8_t xi0 = static_cast<uint8_t>(std::min(15, (int)(int8_t)(x0 + 0.5f)));
            const uint8_t xi1 = static_cast<uint8_t>(std::min(15, (int)(int8_t)(x1 + 0.5f)));
            y[i].qs[j] = xi0 | static_cast<uint8_t>(xi1 << 4);
        }
    }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t n) {
    constexpr int qk = QK5_0;
    const int64_t nb = n / qk;
    for (int64_t i = 0; i < nb; ++i) {
        const auto [max, amax] = signed_absmax(x + i * qk, qk);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = x[i * qk + 0 + j] * id;
            const float x1 = x[i * qk + qk / 2 + j] * id;
            const uint8_t xi0 = static_cast<uint8_t>(std::min(31, (int)(int8_t)(x0 + 16.5f)));
            const uint8_t xi1 = static_cast<uint8_t>(std::min(31, (int)(int8_t)(x1 + 16.5f)));
            y[i].qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
            qh |= ((xi1 & 0x10u) >> 4) << (j + qk / 2);
        }
        std::memcpy(y[i].qh, &qh, sizeof(qh));
    }
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t n) {
    constexpr int qk = QK5_1;
    const int64_t nb = n / qk;
    for (int64_t i = 0; i < nb; ++i) {
        const auto [min, max] = min_max(x + i * qk, qk);
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = (x[i * qk + 0 + j] - min) * id;
            const float x1 = (x[i * qk + qk / 2 + j] - min) * id;
            // No clamp, as in ggml: x0 <= 31 + rounding, so +0.5 stays < 32.
            const uint8_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
            const uint8_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
            y[i].qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
            qh |= ((xi1 & 0x10u) >> 4) << (j + qk / 2);
        }
        std::memcpy(y[i].qh, &qh, sizeof(qh));
    }
}

void quantize_q8_0(const float* x, block_q8_0* y, int64_t n) {
    const int64_t nb = n / QK8_0;
    for (int64_t i = 0; i < nb; ++i) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[i * QK8_0 + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; ++j) {
            const float x0 = x[i * QK8_0 + j] * id;
            y[i].qs[j] = static_cast<int8_t>(std::round(x0));  // half away from zero, as roundf
        }
    }
}

void quantize_q8_1(const float* x, block_q8_1* y, int64_t n) {
    const int64_t nb = n / QK8_1;
    for (int64_t i = 0; i < nb; ++i) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[i * QK8_1 + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1 / 2; ++j) {
            const float v0 = x[i * QK8_1 + j] * id;
            const float v1 = x[i * QK8_1 + QK8_1 / 2 + j] * id;
            y[i].qs[j] = static_cast<int8_t>(std::round(v0));
            y[i].qs[QK8_1 / 2 + j] = static_cast<int8_t>(std::round(v1));
            sum += y[i].qs[j];
            sum += y[i].qs[QK8_1 / 2 + j];
        }
        y[i].s = fp32_to_fp16(sum * d);
    }
}

// ---- 256-element super-blocks ------------------------------------------------

void quantize_q2_K(const float* x, block_q2_K* y, int64_t n) {
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K];
    uint8_t Laux[16];
    float weights[16];
    float mins[QK_K / 16];
    float scales[QK_K / 16];
    const float q4scale = 15.f;

    for (int64_t i = 0; i < nb; ++i) {
        // 16 groups of 16: a (scale, min) fit per group, weights |x|, by mean
        // absolute error; then the scales and mins themselves to 4 bits.
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j)
                y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
            y[i].d = fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = 0;
            y[i].d = fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j) {
                const int l = nearest_int(iscale * mins[j]);
                y[i].scales[j] |= static_cast<uint8_t>(l << 4);
            }
            y[i].dmin = fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = fp32_to_fp16(0.f);
        }
        // Requantize against the rounded scales actually stored.
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int((x[16 * j + ii] + dm) / d);
                l = std::max(0, std::min(3, l));
                L[16 * j + ii] = static_cast<uint8_t>(l);
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; ++l)
                y[i].qs[j / 4 + l] = static_cast<uint8_t>(
                    L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        x += QK_K;
    }
}

void quantize_q3_K(const float* x, block_q3_K* y, int64_t n) {
    const int64_t nb = n / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; ++i) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
            const float scale = std::fabs(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        std::memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
                l = static_cast<int8_t>(std::max<int>(-32, std::min<int>(31, l)) + 32);
                if (j < 8) {
                    y[i].scales[j] = l & 0xF;
                } else {
                    y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
                }
                l = static_cast<int8_t>(l >> 4);
                y[i].scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
            }
            y[i].d = fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            int8_t sc = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
            sc = static_cast<int8_t>((sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) -
                                     32);
            const float d = fp16_to_fp32(y[i].d) * sc;
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16 * j + ii] / d);
                l = std::max(-4, std::min(3, l));
                L[16 * j + ii] = static_cast<int8_t>(l + 4);
            }
        }
        // High bit of quant j goes to hmask[j % 32], bit j / 32.
        std::memset(y[i].hmask, 0, QK_K / 8);
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; ++j) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] = static_cast<int8_t>(L[j] - 4);
            }
            if (++m == QK_K / 8) {
                m = 0;
                hm = static_cast<uint8_t>(hm << 1);
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; ++l)
                y[i].qs[j / 4 + l] = static_cast<uint8_t>(
                    L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        x += QK_K;
    }
}

namespace {

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per 32-group (scale, min) fits
// with weights av_x + |x|, then 6-bit scales/mins relative to the maxima, then
// the quants requantized against the stored scales. Writes d, dmin, scales
// and the quants L[256] (unpacked).
void quantize_k4_common(const float* x, int nmax, float rmin, float rdelta, int nstep, f16_t* d_out,
                        f16_t* dmin_out, uint8_t* packed_scales, uint8_t* L) {
    uint8_t Laux[32];
    float weights[32];
    float mins[QK_K / 32];
    float scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, rdelta, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
        uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
        ls = std::min<uint8_t>(63, ls);
        lm = std::min<uint8_t>(63, lm);
        pack_scale_min_k4(j, ls, lm, packed_scales);
    }
    *d_out = fp32_to_fp16(max_scale / 63.f);
    *dmin_out = fp32_to_fp16(max_min / 63.f);
    uint8_t sc, m;
    for (int j = 0; j < QK_K / 32; ++j) {
        get_scale_min_k4(j, packed_scales, &sc, &m);
        const float d = fp16_to_fp32(*d_out) * sc;
        if (!d) continue;
        const float dm = fp16_to_fp32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            l = std::max(0, std::min(nmax, l));
            L[32 * j + ii] = static_cast<uint8_t>(l);
        }
    }
}

}  // namespace

void quantize_q4_K(const float* x, block_q4_K* y, int64_t n) {
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; ++i) {
        std::memset(y[i].scales, 0, K_SCALE_SIZE);
        quantize_k4_common(x, 15, -1.f, 0.1f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        // 64 elements per 32 bytes: low nibbles the first 32, high the next.
        uint8_t* q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; ++l)
                q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
        x += QK_K;
    }
}

void quantize_q5_K(const float* x, block_q5_K* y, int64_t n) {
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; ++i) {
        std::memset(y[i].scales, 0, K_SCALE_SIZE);
        quantize_k4_common(x, 31, -0.5f, 0.1f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t* qh = y[i].qh;
        uint8_t* ql = y[i].qs;
        std::memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int j0 = 0; j0 < QK_K; j0 += 64) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[j0 + j];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                int l2 = L[j0 + j + 32];
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
            }
            m1 = static_cast<uint8_t>(m1 << 2);
            m2 = static_cast<uint8_t>(m2 << 2);
            ql += 32;
        }
        x += QK_K;
    }
}

void quantize_q6_K(const float* x, block_q6_K* y, int64_t n) {
    const int64_t nb = n / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; ++i) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, nullptr);
            scales[ib] = scale;
            const float abs_scale = std::fabs(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[i], 0, sizeof(block_q6_K));
            y[i].d = fp32_to_fp16(0.f);
            x += QK_K;
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib)
            y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16 * j + ii] / d);
                l = std::max(-32, std::min(31, l));
                L[16 * j + ii] = static_cast<int8_t>(l + 32);
            }
        }
        uint8_t* ql = y[i].ql;
        uint8_t* qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l + 0] & 0xF;
                const uint8_t q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF;
                const uint8_t q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
                ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
                qh[l] =
                    static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                         ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
        x += QK_K;
    }
}

void quantize_q8_K(const float* x, block_q8_K* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const auto [max, amax] = signed_absmax(x, QK_K);
        if (!amax) {
            y[i].d = 0;
            std::memset(y[i].qs, 0, QK_K);
            std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
            x += QK_K;
            continue;
        }
        // -127 (not -128): the largest magnitude maps to -127 so that every
        // quant fits int8 with either sign (ggml changed this for IQ2_XXS).
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = static_cast<int8_t>(std::min(127, v));
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = static_cast<int16_t>(sum);
        }
        y[i].d = 1 / iscale;
        x += QK_K;
    }
}

// ---- non-linear 4-bit --------------------------------------------------------

namespace {

// ggml's quantize_row_iq4_nl_impl for 16 grid values, no importance matrix
// (weights x^2), ntry = 7: per 32-block scale search over 15 candidates; for
// a super-block (IQ4_XS) the block scales are then stored as 6-bit multiples
// of a super-block scale and the quants redone against them.
void quantize_iq4_superblock(int super_block_size, const float* x, f16_t* dh, uint8_t* q4,
                             uint16_t* scales_h, uint8_t* scales_l, float* scales, uint8_t* L) {
    constexpr int block_size = 32;
    constexpr int nvalues = 16;
    constexpr int ntry = 7;
    const int8_t* values = kvalues_iq4nl;
    float weight[block_size];

    std::memset(q4, 0, super_block_size / 2);
    *dh = fp32_to_fp16(0.f);

    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < super_block_size / block_size; ++ib) {
        const float* xb = x + ib * block_size;
        uint8_t* Lb = L + ib * block_size;
        for (int j = 0; j < block_size; ++j) weight[j] = xb[j] * xb[j];
        const auto [max, amax] = signed_absmax(xb, block_size);
        if (amax < kGroupMaxEps) {
            scales[ib] = 0;
            std::memset(Lb, 0, block_size);
            continue;
        }
        float d = -max / values[0];  // ntry > 0
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < block_size; ++j) {
            const float al = id * xb[j];
            const int l = best_index_int8(nvalues, values, al);
            Lb[j] = static_cast<uint8_t>(l);
            const float q = values[l];
            const float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < block_size; ++j) {
                const float al = id * xb[j];
                const int l = best_index_int8(nvalues, values, al);
                const float q = values[l];
                const float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = std::fabs(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    if (super_block_size / block_size > 1) {
        const int nb = super_block_size / block_size;
        std::memset(scales_h, 0, ((nb + 7) / 8) * sizeof(uint16_t));
        const float d = -max_scale / 32;
        *dh = fp32_to_fp16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nb; ++ib) {
            int l = nearest_int(id * scales[ib]);
            l = std::max(-32, std::min(31, l));
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            uint8_t* Lb = L + ib * block_size;
            const float* xb = x + ib * block_size;
            for (int j = 0; j < block_size; ++j)
                Lb[j] = static_cast<uint8_t>(best_index_int8(nvalues, values, idl * xb[j]));
            l += 32;
            const uint8_t l_l = l & 0xf;
            const uint8_t l_h = static_cast<uint8_t>(l >> 4);
            if (ib % 2 == 0)
                scales_l[ib / 2] = l_l;
            else
                scales_l[ib / 2] |= static_cast<uint8_t>(l_l << 4);
            scales_h[ib / 8] |= static_cast<uint16_t>(l_h << 2 * (ib % 8));
        }
    } else {
        *dh = fp32_to_fp16(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < super_block_size; ++j)
            L[j] = static_cast<uint8_t>(best_index_int8(nvalues, values, id * x[j]));
    }

    for (int i = 0; i < super_block_size / 32; ++i)
        for (int j = 0; j < 16; ++j)
            q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

}  // namespace

void quantize_iq4_nl(const float* x, block_iq4_nl* y, int64_t n) {
    const int64_t nb = n / QK4_NL;
    uint8_t L[QK4_NL];
    float scale;
    uint16_t unused_h;
    for (int64_t ib = 0; ib < nb; ++ib)
        quantize_iq4_superblock(QK4_NL, x + QK4_NL * ib, &y[ib].d, y[ib].qs, &unused_h, nullptr,
                                &scale, L);
}

void quantize_iq4_xs(const float* x, block_iq4_xs* y, int64_t n) {
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K];
    float scales[QK_K / 32];
    for (int64_t ib = 0; ib < nb; ++ib) {
        // scales_h is a uint16_t inside a packed-by-layout struct at offset 2:
        // aligned, so a direct pointer is fine.
        quantize_iq4_superblock(QK_K, x + QK_K * ib, &y[ib].d, y[ib].qs, &y[ib].scales_h,
                                y[ib].scales_l, scales, L);
    }
}

}  // namespace minfer::tensor::detail
