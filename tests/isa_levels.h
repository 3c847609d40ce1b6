// Test support: runs a check once per instruction-set level this CPU has
// (backend/cpu/isa.h), the kernels capped at that level, so an AVX-512 host
// tests the AVX2 and scalar paths too. Failures name the level.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/isa.h"

namespace minfer::testing {

// Caps the kernels at `level` for its lifetime, then restores the cap.
class IsaCap {
  public:
    explicit IsaCap(cpu::IsaLevel level) : before_(cpu::isa_level()) { cpu::set_isa_cap(level); }
    ~IsaCap() { cpu::set_isa_cap(before_); }
    IsaCap(const IsaCap&) = delete;
    IsaCap& operator=(const IsaCap&) = delete;

  private:
    cpu::IsaLevel before_;
};

// Turns the Avx2 kernels' AVX-VNNI use on or off for its lifetime.
class AvxVnniAllowed {
  public:
    explicit AvxVnniAllowed(bool allowed) : before_(cpu::avx_vnni_enabled()) {
        cpu::set_avx_vnni_allowed(allowed);
    }
    ~AvxVnniAllowed() { cpu::set_avx_vnni_allowed(before_); }
    AvxVnniAllowed(const AvxVnniAllowed&) = delete;
    AvxVnniAllowed& operator=(const AvxVnniAllowed&) = delete;

  private:
    bool before_;
};

// body(level) once per supported level, lowest first; on a CPU with
// AVX-VNNI the Avx2 level runs twice, without it (what an AVX2-only CPU
// runs) and with it.
template <typename F>
void for_each_isa_level(F&& body) {
    for (cpu::IsaLevel level : cpu::isa_levels_supported()) {
        IsaCap cap(level);
        const bool both = level == cpu::IsaLevel::Avx2 && cpu::cpu_has_avx_vnni();
        for (int pass = both ? 0 : 1; pass < 2; ++pass) {
            const bool vnni = both ? pass == 1 : cpu::avx_vnni_enabled();
            AvxVnniAllowed allowed(vnni);
            SCOPED_TRACE(std::string("kernels capped at ") + cpu::isa_name(level) +
                         (both ? (vnni ? " with AVX-VNNI" : " without AVX-VNNI") : ""));
            body(level);
        }
    }
}

}  // namespace minfer::testing
