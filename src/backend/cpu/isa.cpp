#include "backend/cpu/isa.h"

#include <atomic>
#include <cstdlib>

#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MINFER_ISA_X86 1
#elif defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#define MINFER_ISA_ARM64 1
#endif

namespace minfer::cpu {
namespace {

#ifdef MINFER_ISA_X86
bool x86_avx2() {
    // f16c through cpuid: clang before 16 does not know
    // __builtin_cpu_supports("f16c") (the fuzz build uses clang 14).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
bool x86_avx512() {
    return x86_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}
#endif

IsaLevel detect() {
#ifdef MINFER_ISA_X86
    if (x86_avx512()) return IsaLevel::Avx512;
    if (x86_avx2()) return IsaLevel::Avx2;
#elif defined(MINFER_ISA_ARM64)
    const unsigned long hw = getauxval(AT_HWCAP);
    const unsigned long hw2 = getauxval(AT_HWCAP2);
#ifdef HWCAP2_I8MM
    if ((hw & HWCAP_ASIMDDP) && (hw2 & HWCAP2_I8MM)) return IsaLevel::I8mm;
#endif
    if (hw & HWCAP_ASIMDDP) return IsaLevel::Dotprod;
    if (hw & HWCAP_ASIMD) return IsaLevel::Neon;
    (void)hw2;
#endif
    return IsaLevel::Scalar;
}

bool same_family(IsaLevel a, IsaLevel b) {
    auto family = [](IsaLevel l) {
        switch (l) {
            case IsaLevel::Scalar:
                return 0;
            case IsaLevel::Avx2:
            case IsaLevel::Avx512:
                return 1;
            default:
                return 2;
        }
    };
    return a == IsaLevel::Scalar || b == IsaLevel::Scalar || family(a) == family(b);
}

// The enum's order is the order within a family.
bool at_or_below(IsaLevel level, IsaLevel top) {
    return same_family(level, top) && static_cast<int>(level) <= static_cast<int>(top);
}

const IsaLevel kDetected = detect();
// The cap; starts at the detected level and is lowered by MINFER_CPU (at the
// first isa_level() call) or set_isa_cap. Atomic: kernels on pool threads read it.
std::atomic<int> g_level{-1};

}  // namespace

const char* isa_name(IsaLevel level) {
    switch (level) {
        case IsaLevel::Scalar:
            return "scalar";
        case IsaLevel::Avx2:
            return "avx2";
        case IsaLevel::Avx512:
            return "avx512";
        case IsaLevel::Neon:
            return "neon";
        case IsaLevel::Dotprod:
            return "dotprod";
        case IsaLevel::I8mm:
            return "i8mm";
    }
    return "?";
}

std::optional<IsaLevel> parse_isa(std::string_view name) {
    for (IsaLevel l : {IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Neon,
                       IsaLevel::Dotprod, IsaLevel::I8mm}) {
        if (name == isa_name(l)) return l;
    }
    return std::nullopt;
}

IsaLevel isa_detected() {
    return kDetected;
}

std::vector<IsaLevel> isa_levels_supported() {
    std::vector<IsaLevel> out;
    for (IsaLevel l : {IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Neon,
                       IsaLevel::Dotprod, IsaLevel::I8mm}) {
        if (at_or_below(l, kDetected)) out.push_back(l);
    }
    return out;
}

void set_isa_cap(IsaLevel level) {
    if (!at_or_below(level, kDetected)) {
        throw Error(std::string("MINFER_CPU: this CPU cannot run the '") + isa_name(level) +
                    "' kernels (it supports up to '" + isa_name(kDetected) + "')");
    }
    g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void apply_isa_env() {
    const char* env = std::getenv("MINFER_CPU");
    if (env == nullptr || env[0] == '\0') {
        int expected = -1;
        g_level.compare_exchange_strong(expected, static_cast<int>(kDetected));
        return;
    }
    const auto level = parse_isa(env);
    if (!level) {
        throw Error(std::string("MINFER_CPU='") + env +
                    "' is not a level: use scalar, avx2 or avx512 (x86-64), "
                    "neon, dotprod or i8mm (ARM64)");
    }
    set_isa_cap(*level);
}

IsaLevel isa_level() {
    int v = g_level.load(std::memory_order_relaxed);
    if (v < 0) {
        // First use without the CLI having applied MINFER_CPU (tests,
        // benchmarks): apply it now; a bad value there falls back to the
        // detected level, and the CLI, which calls apply_isa_env first,
        // reports it as an error.
        try {
            apply_isa_env();
        } catch (const Error&) {
            int expected = -1;
            g_level.compare_exchange_strong(expected, static_cast<int>(kDetected));
        }
        v = g_level.load(std::memory_order_relaxed);
    }
    return static_cast<IsaLevel>(v);
}

bool isa_at_least(IsaLevel level) {
    return at_or_below(level, isa_level());
}

bool cpu_has_avx_vnni() {
#ifdef MINFER_ISA_X86
    static const bool yes = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        // CPUID.(EAX=7,ECX=1):EAX bit 4 = AVX-VNNI (VEX-encoded vpdpbusd).
        return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
    }();
    return yes;
#else
    return false;
#endif
}

namespace {
// -1: not decided yet (MINFER_AVX_VNNI read at the first use); 0 / 1.
std::atomic<int> g_avx_vnni_allowed{-1};
}  // namespace

bool avx_vnni_enabled() {
    if (!cpu_has_avx_vnni()) return false;
    int v = g_avx_vnni_allowed.load(std::memory_order_relaxed);
    if (v < 0) {
        const char* env = std::getenv("MINFER_AVX_VNNI");
        const int from_env = env != nullptr && env[0] == '0' ? 0 : 1;
        g_avx_vnni_allowed.compare_exchange_strong(v, from_env);
        v = g_avx_vnni_allowed.load(std::memory_order_relaxed);
    }
    return v == 1;
}

void set_avx_vnni_allowed(bool allowed) {
    g_avx_vnni_allowed.store(allowed ? 1 : 0, std::memory_order_relaxed);
}

bool cpu_has_avx512_bitalg() {
#ifdef MINFER_ISA_X86
    static const bool yes = __builtin_cpu_supports("avx512bitalg");
    return yes;
#else
    return false;
#endif
}

}  // namespace minfer::cpu
