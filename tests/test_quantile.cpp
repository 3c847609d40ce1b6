// util/quantile.h: the one quantile rule of every report (nearest rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "util/quantile.h"

namespace {

using minfer::quantile;
using minfer::quantile_index;
using minfer::quantile_of_sorted;

TEST(Quantile, NearestRankOfOneToHundred) {
    std::vector<float> v;
    for (int i = 1; i <= 100; ++i) v.push_back(float(i));
    // Rank ceil(q n): where q n is a whole number the quantile is that value,
    // not the next one.
    EXPECT_EQ(quantile_of_sorted(v, 0.50), 50.0);
    EXPECT_EQ(quantile_of_sorted(v, 0.99), 99.0);
    EXPECT_EQ(quantile_of_sorted(v, 1.00), 100.0);
    EXPECT_EQ(quantile_of_sorted(v, 0.00), 1.0);
    EXPECT_EQ(quantile_of_sorted(v, 0.01), 1.0);
    EXPECT_EQ(quantile_of_sorted(v, 0.011), 2.0);
    EXPECT_EQ(quantile_of_sorted(v, 0.995), 100.0);
}

TEST(Quantile, IndexIsARankWithinTheSample) {
    EXPECT_EQ(quantile_index(1, 0.0), 0u);
    EXPECT_EQ(quantile_index(1, 0.99), 0u);
    EXPECT_EQ(quantile_index(5, 0.5), 2u);  // the median of an odd count
    EXPECT_EQ(quantile_index(4, 0.5), 1u);  // the lower middle of an even count
    EXPECT_EQ(quantile_index(3, 1.0), 2u);
    EXPECT_EQ(quantile_index(10, 0.95), 9u);
}

TEST(Quantile, UnsortedEqualsSortedAndEmptyIsZero) {
    std::mt19937 rng(7);
    std::vector<double> v(257);
    for (auto& x : v) x = std::uniform_real_distribution<double>(0, 1000)(rng);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    for (double q : {0.0, 0.1, 0.5, 0.9, 0.99, 1.0})
        EXPECT_EQ(quantile(v, q), quantile_of_sorted(sorted, q)) << q;
    EXPECT_EQ(quantile(std::vector<float>{}, 0.5), 0.0);
    EXPECT_EQ(quantile_of_sorted(std::vector<double>{}, 0.99), 0.0);
    EXPECT_EQ(quantile(std::vector<float>{4.5f}, 0.99), 4.5);
}

}  // namespace
