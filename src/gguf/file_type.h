// llama.cpp's file types (enum llama_ftype, stored as general.file_type):
// what `minfer info` prints and what `minfer quantize` is asked for.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tensor/dtype.h"

namespace minfer::gguf {

// "MOSTLY_Q4_K_M" for 15; nullopt for an id minfer does not know.
std::optional<std::string_view> file_type_name(uint32_t id);
// Accepts "MOSTLY_Q4_K_M", "Q4_K_M", "q4_k_m", "ALL_F32", "F32" (case-insensitive).
std::optional<uint32_t> file_type_from_name(std::string_view name);
// The short name quantize users type: "Q4_K_M", "F32", "BF16" (nullopt if unknown).
std::optional<std::string_view> file_type_short_name(uint32_t id);
// The tensor type a file type is named after (Q4_K for Q4_K_M, F16 for MOSTLY_F16).
std::optional<tensor::DType> file_type_main_dtype(uint32_t id);
// "MOSTLY_Q4_K_M (15)" or "unknown (99)"; llama.cpp's GUESSED bit (1024) is
// shown as " (guessed)".
std::string describe_file_type(uint32_t id);

}  // namespace minfer::gguf
