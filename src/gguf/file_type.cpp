#include "gguf/file_type.h"

#include <array>
#include <cctype>

namespace minfer::gguf {

namespace {

struct FileType {
    uint32_t id;
    std::string_view name;  // llama.cpp's enum name without LLAMA_FTYPE_
    std::string_view short_name;
    tensor::DType main;
};

// Ids from llama.h's enum llama_ftype; 4-6 and the IQ1/IQ2/IQ3 types are left
// out because minfer has no kernels for them.
constexpr std::array<FileType, 19> kFileTypes = {{
    {0, "ALL_F32", "F32", tensor::DType::F32},
    {1, "MOSTLY_F16", "F16", tensor::DType::F16},
    {2, "MOSTLY_Q4_0", "Q4_0", tensor::DType::Q4_0},
    {3, "MOSTLY_Q4_1", "Q4_1", tensor::DType::Q4_1},
    {7, "MOSTLY_Q8_0", "Q8_0", tensor::DType::Q8_0},
    {8, "MOSTLY_Q5_0", "Q5_0", tensor::DType::Q5_0},
    {9, "MOSTLY_Q5_1", "Q5_1", tensor::DType::Q5_1},
    {10, "MOSTLY_Q2_K", "Q2_K", tensor::DType::Q2_K},
    {11, "MOSTLY_Q3_K_S", "Q3_K_S", tensor::DType::Q3_K},
    {12, "MOSTLY_Q3_K_M", "Q3_K_M", tensor::DType::Q3_K},
    {13, "MOSTLY_Q3_K_L", "Q3_K_L", tensor::DType::Q3_K},
    {14, "MOSTLY_Q4_K_S", "Q4_K_S", tensor::DType::Q4_K},
    {15, "MOSTLY_Q4_K_M", "Q4_K_M", tensor::DType::Q4_K},
    {16, "MOSTLY_Q5_K_S", "Q5_K_S", tensor::DType::Q5_K},
    {17, "MOSTLY_Q5_K_M", "Q5_K_M", tensor::DType::Q5_K},
    {18, "MOSTLY_Q6_K", "Q6_K", tensor::DType::Q6_K},
    {25, "MOSTLY_IQ4_NL", "IQ4_NL", tensor::DType::IQ4_NL},
    {30, "MOSTLY_IQ4_XS", "IQ4_XS", tensor::DType::IQ4_XS},
    {32, "MOSTLY_BF16", "BF16", tensor::DType::BF16},
}};

constexpr uint32_t kGuessed = 1024;

const FileType* by_id(uint32_t id) {
    for (const auto& f : kFileTypes)
        if (f.id == id) return &f;
    return nullptr;
}

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::toupper(static_cast<unsigned char>(a[i])) !=
            std::toupper(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}

}  // namespace

std::optional<std::string_view> file_type_name(uint32_t id) {
    const FileType* f = by_id(id);
    if (!f) return std::nullopt;
    return f->name;
}

std::optional<std::string_view> file_type_short_name(uint32_t id) {
    const FileType* f = by_id(id);
    if (!f) return std::nullopt;
    return f->short_name;
}

std::optional<uint32_t> file_type_from_name(std::string_view name) {
    for (const auto& f : kFileTypes)
        if (iequals(f.name, name) || iequals(f.short_name, name)) return f.id;
    return std::nullopt;
}

std::optional<tensor::DType> file_type_main_dtype(uint32_t id) {
    const FileType* f = by_id(id);
    if (!f) return std::nullopt;
    return f->main;
}

std::string describe_file_type(uint32_t id) {
    const bool guessed = (id & kGuessed) != 0;
    const uint32_t base = id & ~kGuessed;
    auto name = file_type_name(base);
    std::string s = name ? std::string(*name) : "unknown";
    s += " (" + std::to_string(base) + ")";
    if (guessed) s += " (guessed)";
    return s;
}

}  // namespace minfer::gguf
