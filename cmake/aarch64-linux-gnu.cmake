# Cross-compiles minfer for 64-bit ARM Linux with Debian's cross compiler
# (g++-aarch64-linux-gnu); scripts/test_arm64.sh uses it and runs the result
# under qemu-aarch64. Libraries come from the cross sysroot and from
# MINFER_ARM64_DEPS (GoogleTest built for arm64 and a view of the host's
# header-only nlohmann-json), never from the host's x86-64 /usr/lib.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# No contraction of a * b + c into fused multiply-adds in the portable code:
# FMA is in the ARMv8 baseline and GCC fuses by default even in ISO C++ mode,
# while x86-64's baseline has no FMA. Fused, the reference quantizers (and the
# activation quantizers) round differently from x86 and from llama.cpp's
# golden blocks; the NEON kernels still use FMA where they ask for it.
set(CMAKE_CXX_FLAGS_INIT "-ffp-contract=off")
set(CMAKE_C_FLAGS_INIT "-ffp-contract=off")

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
if(DEFINED ENV{MINFER_ARM64_DEPS})
  list(APPEND CMAKE_FIND_ROOT_PATH $ENV{MINFER_ARM64_DEPS})
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest and gtest_discover_tests run the arm64 test binary through the
# emulator; QEMU_LD_PREFIX (set by the script) points it at the arm64 libc.
find_program(MINFER_QEMU_AARCH64 qemu-aarch64)
if(MINFER_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MINFER_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
