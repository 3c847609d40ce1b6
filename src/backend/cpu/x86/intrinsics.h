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
