// A read-only memory map of a whole file. Weights stay in the page cache and
// are never copied; the map lives as long as the model that views it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace minfer {

class MappedFile {
  public:
    MappedFile() = default;
    // Throws minfer::Error naming the path for a missing file, a directory,
    // or a failed map. An empty file maps to size() == 0, data() == nullptr.
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // Drops the whole pages inside [p, p + n) from this process's resident
    // memory (a copy of those bytes took their place); reading them again
    // would fault them back in from the file.
    void release(const void* p, size_t n) const;

  private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace minfer
