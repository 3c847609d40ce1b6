// Whether this test binary is built with a sanitizer (GCC defines
// __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, Clang answers __has_feature).
// Tests whose cost is a number of repetitions over a corpus (schemas walked,
// outputs sampled) take a subset under a sanitizer: what a sanitizer checks
// is each code path's memory and thread behaviour, which the subset reaches
// as the whole corpus does, at 5-10x the cost per repetition. The Release
// run keeps the whole corpus and its statistical assertions.
#pragma once

#include <cstddef>

namespace minfer::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Every corpus entry in Release, every `stride`-th under a sanitizer.
inline bool in_sanitized_subset(size_t index, size_t stride = 4) {
    return !kSanitized || index % stride == 0;
}

}  // namespace minfer::testing
