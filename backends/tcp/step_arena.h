// comm::tcp::StepArena: the memory of one Exchange's few small vectors (its
// transfers, their parts, the peers it confirms to), and StepAllocator, the
// allocator those vectors use to take it.
//
// The arena hands out a buffer that lives inside it, bumping an offset, and
// takes heap blocks only once the buffer is used up. Nothing is given back
// before the arena is destroyed, which frees the heap blocks. It does what
// std::pmr::monotonic_buffer_resource over a buffer does, without that
// class's virtual call for each allocation and deallocation and its release
// on destruction: a step of a small call makes three allocations, and those
// calls, the resource's destruction and the polymorphic allocators' own
// code were a measurable share of the call (bench/README.md, "The cost of
// a small call").
//
// Not thread-safe: an Exchange runs on one thread. Neither copied nor
// moved, since the vectors' allocators point at it.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <new>

namespace comm::tcp {

class StepArena {
 public:
  // The bytes the arena holds in itself.
  static constexpr std::size_t kInlineBytes = 2048;

  StepArena() = default;
  StepArena(const StepArena&) = delete;
  StepArena& operator=(const StepArena&) = delete;
  ~StepArena() {
    while (heap_ != nullptr) {
      HeapBlock* next = heap_->next;
      ::operator delete(heap_);
      heap_ = next;
    }
  }

  // `bytes` aligned to `alignment`, a power of two no larger than
  // alignof(std::max_align_t): from the buffer while it has room, else
  // from a heap block of its own. Throws std::bad_alloc.
  void* allocate(std::size_t bytes, std::size_t alignment) {
    assert(alignment != 0 && (alignment & (alignment - 1)) == 0 &&
           alignment <= alignof(std::max_align_t));
    const std::size_t start = (used_ + alignment - 1) & ~(alignment - 1);
    if (start <= kInlineBytes && bytes <= kInlineBytes - start) {
      used_ = start + bytes;
      return buffer_ + start;
    }
    return allocate_on_heap(bytes);
  }

 private:
  // A heap block's header, padded so that what follows it is aligned for
  // any type.
  struct alignas(std::max_align_t) HeapBlock {
    HeapBlock* next;
  };

  void* allocate_on_heap(std::size_t bytes) {
    if (bytes > SIZE_MAX - sizeof(HeapBlock)) throw std::bad_alloc();
    auto* block =
        static_cast<HeapBlock*>(::operator new(sizeof(HeapBlock) + bytes));
    block->next = heap_;
    heap_ = block;
    return block + 1;
  }

  alignas(std::max_align_t) std::byte buffer_[kInlineBytes];
  std::size_t used_ = 0;
  HeapBlock* heap_ = nullptr;  // the newest; each names the one before
};

// A standard allocator over a StepArena: deallocate() does nothing, as the
// arena frees everything at once. Two are equal when they use the same
// arena, so a vector moved keeps its memory.
template <typename T>
class StepAllocator {
 public:
  using value_type = T;
  static_assert(alignof(T) <= alignof(std::max_align_t),
                "a StepArena aligns to std::max_align_t at most");

  explicit StepAllocator(StepArena* arena) noexcept : arena_(arena) {}
  template <typename U>
  StepAllocator(const StepAllocator<U>& other) noexcept
      : arena_(other.arena()) {}

  T* allocate(std::size_t count) {
    if (count > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(arena_->allocate(count * sizeof(T), alignof(T)));
  }
  void deallocate(T*, std::size_t) noexcept {}

  StepArena* arena() const noexcept { return arena_; }
  template <typename U>
  bool operator==(const StepAllocator<U>& other) const noexcept {
    return arena_ == other.arena();
  }

 private:
  StepArena* arena_;
};

}  // namespace comm::tcp
