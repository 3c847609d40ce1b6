#include "backend/cpu/host_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "util/error.h"
#include "util/huge_pages.h"
#include "util/out_of_memory.h"

namespace minfer::backend {

void HostPool::AlignedDelete::operator()(uint8_t* p) const {
    ::operator delete[](p, std::align_val_t{align});
}

namespace {
size_t physical_memory_bytes() {
    static const size_t bytes = [] {
        const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
        if (pages <= 0 || page <= 0) return std::numeric_limits<size_t>::max();
        return static_cast<size_t>(pages) * static_cast<size_t>(page);
    }();
    return bytes;
}
}  // namespace

BufferId HostPool::create(size_t bytes) {
    // At least one alignment unit, so every buffer has a distinct address.
    const size_t cap = std::max(bytes, kAlign);
    // A request the machine cannot serve (a huge context) is an input error
    // with its size, not a std::bad_alloc from deep in the allocator. Buffers
    // are zeroed, so every byte is committed: beyond physical memory the
    // kernel would accept the allocation (overcommit) and then kill the
    // process in the memset; refuse before that.
    if (cap > physical_memory_bytes() || stats_.bytes + cap > physical_memory_bytes())
        throw OutOfMemory(cap, "a host buffer (" + OutOfMemory::mib(stats_.bytes) +
                                   " already allocated, " +
                                   OutOfMemory::mib(physical_memory_bytes()) + " of RAM)");
    const size_t align = cap >= kHugeMin ? kHugePage : kAlign;
    auto* raw = static_cast<uint8_t*>(::operator new[](cap, std::align_val_t{align}, std::nothrow));
    if (!raw) throw OutOfMemory(cap, "a host buffer");
    // Attention walks a KV pool at a stride of a cell (kilobytes), touching
    // a new 4 KiB page every cell or two; in 2 MiB pages the walk's
    // translations stay in the TLB.
    if (align == kHugePage) advise_huge_pages(raw, cap);
    std::memset(raw, 0, cap);  // faults the pages in (huge ones where granted)
    Buf b;
    b.mem = std::unique_ptr<uint8_t[], AlignedDelete>(raw, AlignedDelete{align});
    b.bytes = bytes;
    bufs_.push_back(std::move(b));
    ++stats_.n_buffers;
    ++stats_.allocations;
    stats_.bytes += bytes;
    return static_cast<BufferId>(bufs_.size() - 1);
}

BufferId HostPool::allocate(size_t bytes) {
    auto it = std::find_if(free_.begin(), free_.end(),
                           [&](BufferId id) { return bufs_[id].bytes == bytes; });
    if (it != free_.end()) {
        const BufferId id = *it;
        *it = free_.back();
        free_.pop_back();
        bufs_[id].free = false;
        std::memset(bufs_[id].mem.get(), 0, bytes);
        ++stats_.recycled;
        return id;
    }
    return create(bytes);
}

BufferId HostPool::allocate_fresh(size_t bytes) {
    return create(bytes);
}

void HostPool::free(BufferId id) {
    MINFER_ASSERT_MSG(id < bufs_.size(), "free of an unknown buffer id");
    MINFER_ASSERT_MSG(!bufs_[id].released, "free of a released buffer");
    if (bufs_[id].free) return;
    bufs_[id].free = true;
    free_.push_back(id);
}

void HostPool::release(BufferId id) {
    MINFER_ASSERT_MSG(id < bufs_.size(), "release of an unknown buffer id");
    Buf& b = bufs_[id];
    if (b.released) return;
    if (b.free) free_.erase(std::find(free_.begin(), free_.end(), id));
    b.mem.reset();
    stats_.bytes -= b.bytes;
    b.bytes = 0;
    b.free = false;
    b.released = true;
    ++stats_.released;
}

bool HostPool::is_released(BufferId id) const {
    MINFER_ASSERT_MSG(id < bufs_.size(), "unknown buffer id");
    return bufs_[id].released;
}

size_t HostPool::buffer_bytes(BufferId id) const {
    MINFER_ASSERT_MSG(id < bufs_.size(), "unknown buffer id");
    return bufs_[id].bytes;
}

bool HostPool::is_free(BufferId id) const {
    MINFER_ASSERT_MSG(id < bufs_.size(), "unknown buffer id");
    return bufs_[id].free;
}

const uint8_t* HostPool::resolve(const BufRef& ref) const {
    MINFER_ASSERT_MSG(ref.id < bufs_.size(), "BufRef names an unknown buffer id");
    const Buf& b = bufs_[ref.id];
    MINFER_ASSERT_MSG(!b.released, "BufRef names a released buffer");
    MINFER_ASSERT_MSG(ref.offset <= b.bytes && ref.len <= b.bytes - ref.offset,
                      "BufRef window outside its buffer");
    return b.mem.get() + ref.offset;
}

uint8_t* HostPool::resolve(const BufRef& ref) {
    return const_cast<uint8_t*>(static_cast<const HostPool*>(this)->resolve(ref));
}

void HostPool::write(const BufRef& dst, const void* src, size_t nbytes) {
    if (nbytes > dst.len)
        throw Error("write_host: " + std::to_string(nbytes) + " bytes into a window of " +
                    std::to_string(dst.len) + " (buffer " + std::to_string(dst.id) + ")");
    if (nbytes) std::memcpy(resolve(dst), src, nbytes);
}

void HostPool::read(const BufRef& src, void* dst, size_t nbytes) const {
    if (nbytes > src.len)
        throw Error("read_host: " + std::to_string(nbytes) + " bytes from a window of " +
                    std::to_string(src.len) + " (buffer " + std::to_string(src.id) + ")");
    if (nbytes) std::memcpy(dst, resolve(src), nbytes);
}

}  // namespace minfer::backend
