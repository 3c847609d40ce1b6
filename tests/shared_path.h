// The path of a file under ../shared (models, llama.cpp references, the
// seed), for the tests and the benchmarks alike; shared_files.h adds the
// tests' skip-or-fail rule for when it is absent.
#pragma once

#include <filesystem>
#include <string>

namespace minfer::testing {

inline std::string shared_file(const std::string& rel) {
    return (std::filesystem::path(MINFER_SHARED_DIR) / rel).string();
}

}  // namespace minfer::testing
