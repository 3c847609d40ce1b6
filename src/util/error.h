// Errors: two kinds, kept apart on purpose.
//  - minfer::Error: a recoverable failure caused by input (a bad file, flag,
//    prompt). Thrown, caught by the CLI, printed, non-zero exit. The message
//    names the file / key / tensor / value at fault.
//  - MINFER_ASSERT: an invariant of our own code (a bug). Aborts with file and
//    line; never used for anything a user can provoke.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace minfer {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line,
                                     const char* msg) {
    std::fprintf(stderr, "minfer: internal error at %s:%d: %s%s%s\n", file, line, expr,
                 msg[0] ? " — " : "", msg);
    std::abort();
}

}  // namespace minfer

#define MINFER_ASSERT(cond)                                                \
    do {                                                                   \
        if (!(cond)) ::minfer::assert_fail(#cond, __FILE__, __LINE__, ""); \
    } while (0)
#define MINFER_ASSERT_MSG(cond, msg)                                          \
    do {                                                                      \
        if (!(cond)) ::minfer::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
    } while (0)
