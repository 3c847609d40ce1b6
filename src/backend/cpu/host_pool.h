// A pool of host buffers shared by the CPU and the queue backends: stable
// ids, memory that never moves while its id is held (a queue records raw
// pointers), 64-byte alignment for SIMD rows (2 MiB and transparent huge
// pages for large buffers), exact-size free-list recycling, and release()
// to give a buffer's memory back to the system (the shared activation
// arena when it grows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ir/backend.h"

namespace minfer::backend {

class HostPool {
  public:
    static constexpr size_t kAlign = 64;
    // Buffers of at least kHugeMin bytes (the KV pools, the activation
    // arena) start on a 2 MiB boundary and ask for transparent huge pages.
    static constexpr size_t kHugePage = size_t{2} << 20, kHugeMin = size_t{8} << 20;

    // A free buffer of exactly `bytes` (zeroed, so stale data cannot leak)
    // or a new zeroed one.
    BufferId allocate(size_t bytes);
    // Always a new buffer (split staging must never see the free list).
    BufferId allocate_fresh(size_t bytes);
    void free(BufferId id);  // idempotent
    // Give the buffer's memory back to the system now (not to the free
    // list): its id is dead from here on (resolve and free assert), and its
    // bytes leave stats().bytes. Idempotent.
    void release(BufferId id);
    bool is_released(BufferId id) const;
    size_t buffer_bytes(BufferId id) const;
    bool is_free(BufferId id) const;
    PoolStats stats() const { return stats_; }

    // Host pointer to the start of ref's window, after checking that the
    // window lies inside its buffer (a bug otherwise).
    uint8_t* resolve(const BufRef& ref);
    const uint8_t* resolve(const BufRef& ref) const;
    // Copy into / out of a window; throws minfer::Error when nbytes exceeds
    // the window.
    void write(const BufRef& dst, const void* src, size_t nbytes);
    void read(const BufRef& src, void* dst, size_t nbytes) const;

  private:
    struct AlignedDelete {
        size_t align;  // as allocated
        void operator()(uint8_t* p) const;
    };
    struct Buf {
        std::unique_ptr<uint8_t[], AlignedDelete> mem;  // [bytes], 64-byte aligned at least
        size_t bytes = 0;
        bool free = false;
        bool released = false;  // memory returned by release(); the id is dead
    };
    BufferId create(size_t bytes);

    std::vector<Buf> bufs_;       // index = BufferId; never shrinks
    std::vector<BufferId> free_;  // ids whose Buf::free is set
    PoolStats stats_;
};

}  // namespace minfer::backend
