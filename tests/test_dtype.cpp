#include <gtest/gtest.h>

#include <cmath>

#include "tensor/dtype.h"

using namespace minfer::tensor;

TEST(DType, TraitsMatchGgmlIdsAndBlockSizes) {
    EXPECT_EQ(traits(DType::Q4_K).type_size, 144u);
    EXPECT_EQ(traits(DType::Q6_K).block_size, 256);
    EXPECT_EQ(dtype_traits(4), nullptr);  // removed ggml type id
    EXPECT_EQ(dtype_from_name("Q8_0"), DType::Q8_0);
    EXPECT_EQ(row_size(DType::Q8_0, 64), 68u);
}

TEST(DType, HalfConversionsAreExactOnRepresentableValues) {
    for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-8f}) {
        EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(f)), f) << f;
    }
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to +inf
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
    EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(3.0f)), 3.0f);
    EXPECT_EQ(fp32_to_bf16(1.00390625f), 0x3f80);  // ties to even
}
