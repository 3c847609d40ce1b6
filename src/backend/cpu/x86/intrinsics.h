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
