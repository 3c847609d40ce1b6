// A memory allocation that failed. The allocator knows the size; whoever
// knows the purpose rethrows it with that ("out of memory allocating
// 16384 MiB for the KV cache of layer 0"). An Error, so the CLI prints it
// and exits 1 instead of dying of std::bad_alloc.
#pragma once

#include <cstdio>
#include <string>

#include "util/error.h"

namespace minfer {

class OutOfMemory : public Error {
  public:
    OutOfMemory(size_t bytes, const std::string& purpose)
        : Error("out of memory allocating " + mib(bytes) + " for " + purpose), bytes_(bytes) {}
    size_t bytes() const { return bytes_; }
    static std::string mib(size_t bytes) {
        const double m = static_cast<double>(bytes) / (1024.0 * 1024.0);
        char buf[64];
        std::snprintf(buf, sizeof buf, m >= 10 ? "%.0f MiB" : "%.2f MiB", m);
        return buf;
    }

  private:
    size_t bytes_;
};

}  // namespace minfer
