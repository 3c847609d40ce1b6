// <immintrin.h> for the x86 kernels, without GCC 12's false -Wuninitialized /
// -Wmaybe-uninitialized inside its own AVX-512 code (the _mm512_undefined_*
// placeholders of permutes and conversions): the warnings point into the
// header's lines, so they are ignored there and nowhere else. Every x86
// kernel and SIMD helper header includes <immintrin.h> through this one.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

// The target attributes of the x86 kernels, one per ISA level (isa.h), so
// every kernel file names a level instead of repeating a feature string.
// Each set is exactly what the level's kernels were built with: adding a
// feature (e.g. fma) could let the compiler contract a*b+c differently and
// change the results.
#if defined(__x86_64__) && defined(__GNUC__)
// Avx2: AVX2 + FMA + F16C.
#define MINFER_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
// Avx2 on a CPU with AVX-VNNI (vpdpbusd on 256-bit vectors).
#define MINFER_TARGET_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
// Avx512: AVX-512 F/BW/DQ/VL + FMA + F16C.
#define MINFER_TARGET_AVX512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
// Avx512 with VNNI (every Avx512 CPU has it, isa.cpp).
#define MINFER_TARGET_AVX512_VNNI \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
// Avx512 with VNNI and BITALG (vpshufbitqmb), where cpu_has_avx512_bitalg().
#define MINFER_TARGET_AVX512_BITALG                                \
    __attribute__((                                                \
        target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl," \
               "avx512vnni,avx512bitalg")))
// The portable loops built per level (whole micro-architecture levels,
// so the compiler may vectorize them with any of the level's features).
#define MINFER_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#define MINFER_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#else
#define MINFER_TARGET_V3
#define MINFER_TARGET_V4
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <cstdint>
namespace minfer::cpu::x86 {
// How far ahead of its reads a kernel asks for a weight stream it reads
// once, from DRAM. The decode kernels of the K-quant super-blocks (Q4_K,
// Q6_K) spend many instructions per byte unpacking them, and the hardware
// prefetchers alone then keep too few lines in flight to cover the
// memory's latency; those kernels also issue software prefetches a few
// super-blocks ahead. So does the regrouped Q8_0 kernel, which on some
// hosts (an Intel Xeon) streams below a plain read without it, in the
// dense decode and the experts' alike. The AVX2 GEMM's micro-kernels
// reading regrouped weights in place prefetch too: a thread's row tiles are
// not adjacent, so the hardware prefetchers start over at every tile.
inline constexpr int64_t kStreamAhead = 8192;
// Prefetches the `bytes` that follow p + kStreamAhead: one block's worth,
// asked for as the kernel starts the block at p. A prefetch does not
// fault, so running past the end of the weights is harmless. The lines go
// to L2 (T1), not L1: an L1 prefetch holds one of the core's few L1 fill
// buffers until its line arrives, so a block's worth of them at once
// stalls the kernel behind them, where L2's queue takes many more.
inline void prefetch_ahead(const void* p, int64_t bytes) {
    const char* a = static_cast<const char*>(p) + kStreamAhead;
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(a + b, _MM_HINT_T1);
}
}  // namespace minfer::cpu::x86
#endif
