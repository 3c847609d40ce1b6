// Which instruction-set level the CPU kernels may use. Every kernel family
// picks its variant through isa_at_least(), so one cap (MINFER_CPU, or a
// test calling set_isa_cap) moves every path down together: an AVX-512 host
// can run and test the AVX2 and scalar paths too.
//
// Levels are ordered within one architecture family:
//   x86-64: Scalar < Avx2 (AVX2 + FMA + F16C; AVX-VNNI-256 where present
//           counts here) < Avx512 (AVX-512 F/BW/DQ/VL + VNNI)
//   ARM64:  Scalar < Neon < Dotprod (sdot/udot) < I8mm (smmla)
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace minfer::cpu {

enum class IsaLevel { Scalar, Avx2, Avx512, Neon, Dotprod, I8mm };

const char* isa_name(IsaLevel level);
// "scalar" | "avx2" | "avx512" | "neon" | "dotprod" | "i8mm"; nullopt otherwise.
std::optional<IsaLevel> parse_isa(std::string_view name);

// The best level this CPU has (ignores any cap).
IsaLevel isa_detected();
// Every level this CPU can run, lowest first (always starts with Scalar).
std::vector<IsaLevel> isa_levels_supported();

// The level the kernels use now: the detected one, capped by MINFER_CPU
// (read once, at the first call) or by set_isa_cap.
IsaLevel isa_level();
// True when the kernels may use `level` (same family and not above the cap).
bool isa_at_least(IsaLevel level);

// Caps the kernels at `level` (tests run each level in turn). Throws
// minfer::Error when the CPU lacks it.
void set_isa_cap(IsaLevel level);
// Reads MINFER_CPU and applies it; throws minfer::Error naming the value
// when it is unknown or the CPU lacks that level. The CLI calls this first
// so a bad value is an error with a non-zero exit, not a silent fallback.
void apply_isa_env();

// Extra CPU features some kernels use inside a level (AVX-VNNI on 256-bit
// vectors within Avx2; AVX-512 BITALG within Avx512).
bool cpu_has_avx_vnni();
bool cpu_has_avx512_bitalg();

// Whether the Avx2 kernels use AVX-VNNI (vpdpbusd on 256-bit vectors): the
// CPU has it and it is not turned off, by MINFER_AVX_VNNI=0 (read once; it
// makes an AVX-VNNI CPU run what an AVX2-only one runs, e.g. to compare the
// two) or by set_avx_vnni_allowed(false) (tests run the Avx2 level both
// ways). The results are bitwise the same either way (exact integer sums).
bool avx_vnni_enabled();
void set_avx_vnni_allowed(bool allowed);

}  // namespace minfer::cpu
