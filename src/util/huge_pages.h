// Transparent huge pages for the big, long-lived buffers (the regrouped
// weights, the KV pools, the activation arena): a decode step streams every
// weight once and walks the KV cache at a stride of a cell, and in 4 KiB
// pages both miss the TLB about every page (measured in model.cpp and
// host_pool.cpp's comments).
#pragma once

#include <sys/mman.h>

#include <cstddef>

namespace minfer {

// Asks the kernel to back [p, p + bytes) with transparent huge pages, which
// the default THP mode ("madvise") grants on request only. Advice only:
// where it is refused or unknown the memory simply stays in 4 KiB pages.
// p should be 2 MiB-aligned, or the first and last partial huge page of the
// range stay small.
inline void advise_huge_pages(void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    ::madvise(p, bytes, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

}  // namespace minfer
