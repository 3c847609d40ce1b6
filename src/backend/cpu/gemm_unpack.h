// One weight row of Q8_0, Q4_0, Q5_0, Q4_K, Q5_K or Q6_K in the GEMMs' common
// form: int8 values [K] (signed, the type's offset removed), a float scale
// per 16 [K/16] and, for Q4_K / Q5_K, -dmin * min per 16 [K/16].
// Included by each GEMM's file (x86/gemm_avx512.cpp, x86/gemm_avx2.cpp,
// arm/gemm_neon.cpp) inside its anonymous namespace, after defining
// MINFER_UNPACK_TARGET (the target attribute its loops vectorize for), so
// each instruction-set level gets its own copy; ARM64 defines it empty, as
// the baseline NEON its three levels share is all the byte loops use.
#pragma once

MINFER_UNPACK_TARGET inline void unpack_row_portable(DType t, const uint8_t* row, int64_t K,
                                                     int8_t* v, float* s, float* m) {
    switch (t) {
        case DType::Q8_0: {
            const auto* x = reinterpret_cast<const block_q8_0*>(row);
            for (int64_t b = 0; b < K / 32; ++b) {
                std::memcpy(v + 32 * b, x[b].qs, 32);
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
        }
        case DType::Q4_0: {
            const auto* x = reinterpret_cast<const block_q4_0*>(row);
            for (int64_t b = 0; b < K / 32; ++b) {
                for (int j = 0; j < 16; ++j) {
                    v[32 * b + j] = static_cast<int8_t>((x[b].qs[j] & 0xF) - 8);
                    v[32 * b + j + 16] = static_cast<int8_t>((x[b].qs[j] >> 4) - 8);
                }
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
        }
        case DType::Q5_0: {
            const auto* x = reinterpret_cast<const block_q5_0*>(row);
            for (int64_t b = 0; b < K / 32; ++b) {
                uint32_t qh;
                std::memcpy(&qh, x[b].qh, 4);
                for (int j = 0; j < 16; ++j) {
                    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
                    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
                    v[32 * b + j] = static_cast<int8_t>(((x[b].qs[j] & 0xF) | h0) - 16);
                    v[32 * b + j + 16] = static_cast<int8_t>(((x[b].qs[j] >> 4) | h1) - 16);
                }
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
        }
        case DType::Q4_K:
        case DType::Q5_K: {
            const bool q5 = t == DType::Q5_K;
            const size_t bsz = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
            for (int64_t b = 0; b < K / QK_K; ++b) {
                const uint8_t* blk = row + static_cast<size_t>(b) * bsz;
                f16_t hd, hm;
                std::memcpy(&hd, blk, 2);
                std::memcpy(&hm, blk + 2, 2);
                const uint8_t* sc = blk + 4;
                const uint8_t* qh = q5 ? blk + 4 + K_SCALE_SIZE : nullptr;
                const uint8_t* qs = blk + 4 + K_SCALE_SIZE + (q5 ? QK_K / 8 : 0);
                const float d = fp16_to_fp32(hd), dmin = fp16_to_fp32(hm);
                int8_t* vb = v + QK_K * b;
                for (int j = 0; j < 4 && !q5; ++j) {
                    const uint8_t* q = qs + 32 * j;
                    for (int l = 0; l < 32; ++l) {
                        vb[64 * j + l] = static_cast<int8_t>(q[l] & 0xF);
                        vb[64 * j + 32 + l] = static_cast<int8_t>(q[l] >> 4);
                    }
                }
                for (int j = 0; j < 4 && q5; ++j) {
                    const uint8_t* q = qs + 32 * j;
                    const uint8_t m1 = static_cast<uint8_t>(1u << (2 * j)),
                                  m2 = static_cast<uint8_t>(2u << (2 * j));
                    for (int l = 0; l < 32; ++l) {
                        int lo = q[l] & 0xF, hi = q[l] >> 4;
                        if (q5) {
                            lo += (qh[l] & m1) ? 16 : 0;
                            hi += (qh[l] & m2) ? 16 : 0;
                        }
                        vb[64 * j + l] = static_cast<int8_t>(lo);
                        vb[64 * j + 32 + l] = static_cast<int8_t>(hi);
                    }
                }
                for (int j = 0; j < 8; ++j) {
                    uint8_t scj, mj;
                    get_scale_min_k4(j, sc, &scj, &mj);
                    const int64_t g = 16 * b + 2 * j;
                    s[g] = s[g + 1] = d * static_cast<float>(scj);
                    m[g] = m[g + 1] = -dmin * static_cast<float>(mj);
                }
            }
            return;
        }
        case DType::Q6_K: {
            const auto* x = reinterpret_cast<const block_q6_K*>(row);
            for (int64_t b = 0; b < K / QK_K; ++b) {
                int8_t* a = v + QK_K * b;
                const uint8_t* ql = x[b].ql;
                const uint8_t* qh = x[b].qh;
                for (int half = 0; half < 2; ++half) {
                    for (int l = 0; l < 32; ++l) {
                        a[l] =
                            static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                        a[l + 32] = static_cast<int8_t>(
                            ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                        a[l + 64] =
                            static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                        a[l + 96] = static_cast<int8_t>(
                            ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                    }
                    a += 128;
                    ql += 64;
                    qh += 32;
                }
                const float d = fp16_to_fp32(x[b].d);
                for (int g = 0; g < 16; ++g) s[16 * b + g] = d * static_cast<float>(x[b].scales[g]);
            }
            return;
        }
        default:
            MINFER_ASSERT_MSG(false, "gemm: no unpacker for this type");
    }
}

// The 6-bit mins of the 8 groups of super-block b of a Q4_K or Q5_K row
// (GGUF layout), and the block's -dmin: the x86 GEMMs multiply the mins by
// the activations' sums in integers, once a super-block, and the sum by
// -dmin (quant_dot.cpp's k4_superblock_gemm_steps).
MINFER_UNPACK_TARGET inline float k4_block_mins(DType t, const uint8_t* row, int64_t b,
                                                uint8_t mins[8]) {
    const size_t bsz = t == DType::Q5_K ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const uint8_t* blk = row + static_cast<size_t>(b) * bsz;
    f16_t hm;
    std::memcpy(&hm, blk + 2, 2);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc;
        get_scale_min_k4(j, blk + 4, &sc, &mins[j]);
    }
    return -fp16_to_fp32(hm);
}

// Row l (of `lanes`) of a panel's mins (gemm_layout::min_block), every
// super-block of a Q4_K or Q5_K row.
MINFER_UNPACK_TARGET inline void k4_row_mins(DType t, const uint8_t* row, int64_t K, int64_t l,
                                             int64_t lanes, void* o) {
    for (int64_t sb = 0; sb < K / QK_K; ++sb) {
        uint8_t mins[8];
        const float neg_dmin = k4_block_mins(t, row, sb, mins);
        int32_t* mb = gemm_layout::min_block(o, sb, lanes);
        for (int k = 0; k < gemm_layout::kMinPairs; ++k)
            mb[lanes * k + l] = static_cast<int32_t>(mins[2 * k] | (mins[2 * k + 1] << 16));
        std::memcpy(mb + lanes * gemm_layout::kMinPairs + l, &neg_dmin, 4);
    }
}

// Rows [r0, r0 + n) of w (row stride w_row_bytes) into the common form;
// an interleaved w (tensor/interleave.h: the AVX-512 layout) has each row
// taken out to gguf_row first. (gemm_layout.h is included before this.)
// on_row(l, row) sees each GGUF row after it is unpacked (the x86 GEMMs
// take their K-quant mins from it).
struct NoRowHook {
    void operator()(int64_t, const uint8_t*) const {}
};
template <class OnRow = NoRowHook>
MINFER_UNPACK_TARGET inline void unpack_rows_portable(DType t, bool interleaved, const uint8_t* w,
                                                      size_t w_row_bytes, int64_t K, int64_t r0,
                                                      int64_t n, const gemm_layout::RowsForm& rows,
                                                      uint8_t* gguf_row, OnRow on_row = {}) {
    for (int64_t l = 0; l < n; ++l) {
        const uint8_t* src = w + static_cast<size_t>(r0 + l) * w_row_bytes;
        if (interleaved) {
            deinterleave_row(t, w, K, r0 + l, gguf_row);
            src = gguf_row;
        }
        unpack_row_portable(t, src, K, rows.v + l * K, rows.s + l * (K / 16),
                            rows.m + l * (K / 16));
        on_row(l, src);
    }
}
