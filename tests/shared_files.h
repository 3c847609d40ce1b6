// Tests that read ../shared (models and llama.cpp references) skip with the
// missing path when it is absent — a user's clone passes without it — and
// fail instead when MINFER_REQUIRE_SHARED=1 (CI, which has it: a skip there
// would hide a test that no longer runs).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "shared_path.h"

namespace minfer::testing {

inline bool shared_required() {
    const char* v = std::getenv("MINFER_REQUIRE_SHARED");
    return v && std::strcmp(v, "1") == 0;
}

}  // namespace minfer::testing

// Skips (or, under MINFER_REQUIRE_SHARED=1, fails) the current test unless
// every path exists; the message names the first missing one.
#define MINFER_REQUIRE_SHARED_FILES(...)                                                     \
    for (const std::string& minfer_path_ : {__VA_ARGS__})                                    \
        if (!std::filesystem::exists(minfer_path_)) {                                        \
            if (::minfer::testing::shared_required())                                        \
                FAIL() << "missing " << minfer_path_ << " (MINFER_REQUIRE_SHARED=1)";        \
            else                                                                             \
                GTEST_SKIP() << "missing " << minfer_path_ << " (../shared is not present)"; \
        }
