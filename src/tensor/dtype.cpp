#include "tensor/dtype.h"

#include <array>
#include <cctype>

#include "util/error.h"

namespace minfer::tensor {

namespace {
constexpr std::array<DTypeTraits, 18> kTraits = {{
    {DType::F32, "f32", 1, 4, false},
    {DType::F16, "f16", 1, 2, false},
    {DType::Q4_0, "q4_0", 32, 18, true},
    {DType::Q4_1, "q4_1", 32, 20, true},
    {DType::Q5_0, "q5_0", 32, 22, true},
    {DType::Q5_1, "q5_1", 32, 24, true},
    {DType::Q8_0, "q8_0", 32, 34, true},
    {DType::Q8_1, "q8_1", 32, 36, true},
    {DType::Q2_K, "q2_K", 256, 84, true},
    {DType::Q3_K, "q3_K", 256, 110, true},
    {DType::Q4_K, "q4_K", 256, 144, true},
    {DType::Q5_K, "q5_K", 256, 176, true},
    {DType::Q6_K, "q6_K", 256, 210, true},
    {DType::Q8_K, "q8_K", 256, 292, true},
    {DType::IQ4_NL, "iq4_nl", 32, 18, true},
    {DType::IQ4_XS, "iq4_xs", 256, 136, true},
    {DType::I32, "i32", 1, 4, false},
    {DType::BF16, "bf16", 1, 2, false},
}};

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(a[i])) !=
            std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    }
    return true;
}
}  // namespace

const DTypeTraits* dtype_traits(uint32_t ggml_id) {
    for (const auto& t : kTraits)
        if (static_cast<uint32_t>(t.type) == ggml_id) return &t;
    return nullptr;
}

const DTypeTraits& traits(DType t) {
    const DTypeTraits* tr = dtype_traits(static_cast<uint32_t>(t));
    MINFER_ASSERT(tr != nullptr);
    return *tr;
}

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto& t : kTraits)
        if (iequals(t.name, name)) return t.type;
    return std::nullopt;
}

}  // namespace minfer::tensor
