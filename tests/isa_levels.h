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

// body(level) once per supported level, lowest first.
template <typename F>
void for_each_isa_level(F&& body) {
    for (cpu::IsaLevel level : cpu::isa_levels_supported()) {
        IsaCap cap(level);
        SCOPED_TRACE(std::string("kernels capped at ") + cpu::isa_name(level));
        body(level);
    }
}

}  // namespace minfer::testing
