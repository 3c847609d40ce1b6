// Quantiles of a sample (latencies, mask times) by one rule for every
// report — the server's /metrics and request log, the CLI's timing line,
// the benchmarks' counters — so that their p50 / p99 mean the same thing.
//
// The rule is nearest rank: the q-quantile of n values is the value of
// rank ceil(q n) (1-based, at least 1) in sorted order — always one of the
// values, never an interpolation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace minfer {

// The 0-based index of the q-quantile (0 <= q <= 1) among n > 0 sorted values.
inline size_t quantile_index(size_t n, double q) {
    const double rank = std::ceil(q * static_cast<double>(n));
    const size_t k = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
    return std::min(n - 1, k);
}

// The q-quantile of values already sorted ascending; 0 when empty.
template <typename T>
double quantile_of_sorted(const std::vector<T>& sorted, double q) {
    if (sorted.empty()) return 0;
    return static_cast<double>(sorted[quantile_index(sorted.size(), q)]);
}

// The q-quantile of values in any order (selected, not sorted); 0 when empty.
template <typename T>
double quantile(std::vector<T> values, double q) {
    if (values.empty()) return 0;
    const auto k = static_cast<std::ptrdiff_t>(quantile_index(values.size(), q));
    std::nth_element(values.begin(), values.begin() + k, values.end());
    return static_cast<double>(values[static_cast<size_t>(k)]);
}

}  // namespace minfer
