// Dequantization of every type, and the dispatch for both directions.
//
// The arithmetic mirrors ggml's dequantize_row_* expression by expression
// (which integers are formed first, which products are taken in float and in
// what order), so that the floats are bit-identical to ggml's when neither
// side contracts a*b+c into an FMA.
#include "tensor/quants.h"

#include <cstring>

#include "tensor/blocks.h"
#include "tensor/quants_impl.h"
#include "util/error.h"

namespace minfer::tensor {

namespace {

void dequantize_q4_0(const block_q4_0* x, float* y, int64_t n) {
    const int64_t nb = n / QK4_0;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[i * QK4_0 + j] = x0 * d;
            y[i * QK4_0 + j + QK4_0 / 2] = x1 * d;
        }
    }
}

void dequantize_q4_1(const block_q4_1* x, float* y, int64_t n) {
    const int64_t nb = n / QK4_1;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const int x0 = x[i].qs[j] & 0x0F;
            const int x1 = x[i].qs[j] >> 4;
            y[i * QK4_1 + j] = x0 * d + m;
            y[i * QK4_1 + j + QK4_1 / 2] = x1 * d + m;
        }
    }
}

void dequantize_q5_0(const block_q5_0* x, float* y, int64_t n) {
    const int64_t nb = n / QK5_0;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        uint32_t qh;
        std::memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < QK5_0 / 2; ++j) {
            // Bit j of qh is the 5th bit of element j, bit j+16 of element j+16.
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            const int32_t x0 = ((x[i].qs[j] & 0x0F) | xh_0) - 16;
            const int32_t x1 = ((x[i].qs[j] >> 4) | xh_1) - 16;
            y[i * QK5_0 + j] = x0 * d;
            y[i * QK5_0 + j + QK5_0 / 2] = x1 * d;
        }
    }
}

void dequantize_q5_1(const block_q5_1* x, float* y, int64_t n) {
    const int64_t nb = n / QK5_1;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        uint32_t qh;
        std::memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < QK5_1 / 2; ++j) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            const int x0 = (x[i].qs[j] & 0x0F) | xh_0;
            const int x1 = (x[i].qs[j] >> 4) | xh_1;
            y[i * QK5_1 + j] = x0 * d + m;
            y[i * QK5_1 + j + QK5_1 / 2] = x1 * d + m;
        }
    }
}

void dequantize_q8_0(const block_q8_0* x, float* y, int64_t n) {
    const int64_t nb = n / QK8_0;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = x[i].qs[j] * d;
    }
}

// ggml has no dequantize_row_q8_1 (Q8_1 only ever feeds dot products); the
// natural definition, with s ignored, is this one.
void dequantize_q8_1(const block_q8_1* x, float* y, int64_t n) {
    const int64_t nb = n / QK8_1;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_1; ++j) y[i * QK8_1 + j] = x[i].qs[j] * d;
    }
}

void dequantize_q2_K(const block_q2_K* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const float min = fp16_to_fp32(x[i].dmin);
        const uint8_t* q = x[i].qs;
        int is = 0;
        // Each 128-element half uses 32 bytes of qs; the 2-bit fields at
        // shift 0,2,4,6 are four consecutive groups of 32 (two scales each).
        for (int half = 0; half < QK_K; half += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                uint8_t sc = x[i].scales[is++];
                float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
                sc = x[i].scales[is++];
                dl = d * (sc & 0xF);
                ml = min * (sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
                shift += 2;
            }
            q += 32;
        }
    }
}

// The 16 signed 6-bit scales of a Q3_K block: low 4 bits in bytes 0..7 (two
// per byte), high 2 bits in bytes 8..11 (four per byte).
void unpack_q3_K_scales(const uint8_t packed[12], int8_t out[16]) {
    for (int j = 0; j < 16; ++j) {
        const int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
    }
}

void dequantize_q3_K(const block_q3_K* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d_all = fp16_to_fp32(x[i].d);
        int8_t scales[16];
        unpack_q3_K_scales(x[i].scales, scales);
        const uint8_t* q = x[i].qs;
        const uint8_t* hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < QK_K; half += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                // scales[] already has the -32 folded in, as ggml's (scales[is] - 32).
                float dl = d_all * scales[is++];
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * ((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
                dl = d_all * scales[is++];
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m <<= 1;
            }
            q += 32;
        }
    }
}

void dequantize_q4_K(const block_q4_K* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* q = x[i].qs;
        const float d = fp16_to_fp32(x[i].d);
        const float min = fp16_to_fp32(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

void dequantize_q5_K(const block_q5_K* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* ql = x[i].qs;
        const uint8_t* qh = x[i].qh;
        const float d = fp16_to_fp32(x[i].d);
        const float min = fp16_to_fp32(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

void dequantize_q6_K(const block_q6_K* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* ql = x[i].ql;
        const uint8_t* qh = x[i].qh;
        const int8_t* sc = x[i].scales;
        for (int half = 0; half < QK_K; half += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void dequantize_q8_K(const block_q8_K* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i)
        for (int j = 0; j < QK_K; ++j) *y++ = x[i].d * x[i].qs[j];
}

void dequantize_iq4_nl(const block_iq4_nl* x, float* y, int64_t n) {
    const int64_t nb = n / QK4_NL;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* qs = x[i].qs;
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_NL / 2; ++j) {
            y[j + 0] = d * kvalues_iq4nl[qs[j] & 0xf];
            y[j + QK4_NL / 2] = d * kvalues_iq4nl[qs[j] >> 4];
        }
        y += QK4_NL;
    }
}

void dequantize_iq4_xs(const block_iq4_xs* x, float* y, int64_t n) {
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* qs = x[i].qs;
        const float d = fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                           (((x[i].scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (ls - 32);
            for (int j = 0; j < 16; ++j) {
                y[j + 0] = dl * kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
            }
            y += 32;
            qs += 16;
        }
    }
}

template <typename Block>
const Block* as(const void* p) {
    return static_cast<const Block*>(p);
}
template <typename Block>
Block* as(void* p) {
    return static_cast<Block*>(p);
}

void check_row(DType type, int64_t n) {
    MINFER_ASSERT(type != DType::I32);
    MINFER_ASSERT(n >= 0 && n % traits(type).block_size == 0);
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
    check_row(type, n);
    switch (type) {
        case DType::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
            return;
        case DType::F16: {
            const auto* s = as<uint16_t>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
            return;
        }
        case DType::BF16: {
            const auto* s = as<uint16_t>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
            return;
        }
        case DType::Q4_0:
            return dequantize_q4_0(as<block_q4_0>(src), dst, n);
        case DType::Q4_1:
            return dequantize_q4_1(as<block_q4_1>(src), dst, n);
        case DType::Q5_0:
            return dequantize_q5_0(as<block_q5_0>(src), dst, n);
        case DType::Q5_1:
            return dequantize_q5_1(as<block_q5_1>(src), dst, n);
        case DType::Q8_0:
            return dequantize_q8_0(as<block_q8_0>(src), dst, n);
        case DType::Q8_1:
            return dequantize_q8_1(as<block_q8_1>(src), dst, n);
        case DType::Q2_K:
            return dequantize_q2_K(as<block_q2_K>(src), dst, n);
        case DType::Q3_K:
            return dequantize_q3_K(as<block_q3_K>(src), dst, n);
        case DType::Q4_K:
            return dequantize_q4_K(as<block_q4_K>(src), dst, n);
        case DType::Q5_K:
            return dequantize_q5_K(as<block_q5_K>(src), dst, n);
        case DType::Q6_K:
            return dequantize_q6_K(as<block_q6_K>(src), dst, n);
        case DType::Q8_K:
            return dequantize_q8_K(as<block_q8_K>(src), dst, n);
        case DType::IQ4_NL:
            return dequantize_iq4_nl(as<block_iq4_nl>(src), dst, n);
        case DType::IQ4_XS:
            return dequantize_iq4_xs(as<block_iq4_xs>(src), dst, n);
        case DType::I32:
            break;
    }
    MINFER_ASSERT_MSG(false, "dequantize_row: unhandled type");
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
    check_row(type, n);
    switch (type) {
        case DType::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
            return;
        case DType::F16: {
            auto* d = as<uint16_t>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
            return;
        }
        case DType::BF16: {
            auto* d = as<uint16_t>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
            return;
        }
        case DType::Q4_0:
            return detail::quantize_q4_0(src, as<block_q4_0>(dst), n);
        case DType::Q4_1:
            return detail::quantize_q4_1(src, as<block_q4_1>(dst), n);
        case DType::Q5_0:
            return detail::quantize_q5_0(src, as<block_q5_0>(dst), n);
        case DType::Q5_1:
            return detail::quantize_q5_1(src, as<block_q5_1>(dst), n);
        case DType::Q8_0:
            return detail::quantize_q8_0(src, as<block_q8_0>(dst), n);
        case DType::Q8_1:
            return detail::quantize_q8_1(src, as<block_q8_1>(dst), n);
        case DType::Q2_K:
            return detail::quantize_q2_K(src, as<block_q2_K>(dst), n);
        case DType::Q3_K:
            return detail::quantize_q3_K(src, as<block_q3_K>(dst), n);
        case DType::Q4_K:
            return detail::quantize_q4_K(src, as<block_q4_K>(dst), n);
        case DType::Q5_K:
            return detail::quantize_q5_K(src, as<block_q5_K>(dst), n);
        case DType::Q6_K:
            return detail::quantize_q6_K(src, as<block_q6_K>(dst), n);
        case DType::Q8_K:
            return detail::quantize_q8_K(src, as<block_q8_K>(dst), n);
        case DType::IQ4_NL:
            return detail::quantize_iq4_nl(src, as<block_iq4_nl>(dst), n);
        case DType::IQ4_XS:
            return detail::quantize_iq4_xs(src, as<block_iq4_xs>(dst), n);
        case DType::I32:
            break;
    }
    MINFER_ASSERT_MSG(false, "quantize_row: unhandled type");
}

// As ggml-cpu's type_traits_cpu[].vec_dot_type.
DType vec_dot_type(DType weight_type) {
    switch (weight_type) {
        case DType::F32:
            return DType::F32;
        case DType::F16:
            return DType::F16;
        case DType::BF16:
            return DType::BF16;
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q8_0:
        case DType::IQ4_NL:
            return DType::Q8_0;
        case DType::Q4_1:
        case DType::Q5_1:
        case DType::Q8_1:
            return DType::Q8_1;
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::Q8_K:
        case DType::IQ4_XS:
            return DType::Q8_K;
        case DType::I32:
            break;
    }
    MINFER_ASSERT_MSG(false, "vec_dot_type: I32 is not a weight type");
    return DType::F32;
}

}  // namespace minfer::tensor
