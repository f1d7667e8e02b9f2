// comm::tcp::StepArena and StepAllocator: allocations are aligned, never
// overlap, come from the arena's own buffer while it has room and from the
// heap past it (freed with the arena: the sanitizer job finds a leak), and
// vectors that use them keep their elements as they grow and move.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "backends/tcp/step_arena.h"

using comm::tcp::StepAllocator;
using comm::tcp::StepArena;

namespace {

bool inside(const StepArena& arena, const void* p) {
  const auto* begin = reinterpret_cast<const std::byte*>(&arena);
  const auto* at = static_cast<const std::byte*>(p);
  return at >= begin && at < begin + sizeof(arena);
}

}  // namespace

TEST_CASE(
    "allocations are aligned, disjoint and inline until the buffer is used "
    "up") {
  StepArena arena;
  struct Taken {
    std::uint8_t* data;
    std::size_t bytes;
  };
  std::vector<Taken> taken;
  // Odd sizes and every alignment up to max_align_t, until well past the
  // buffer.
  const std::size_t alignments[] = {1, 2, 4, 8, alignof(std::max_align_t)};
  std::size_t total = 0;
  for (std::size_t i = 0; total < 3 * StepArena::kInlineBytes; ++i) {
    const std::size_t bytes = 1 + (i * 37) % 300;
    const std::size_t alignment = alignments[i % std::size(alignments)];
    auto* p = static_cast<std::uint8_t*>(arena.allocate(bytes, alignment));
    REQUIRE(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
    std::memset(p, static_cast<int>(i % 251), bytes);
    taken.push_back({p, bytes});
    total += bytes;
  }
  // The first allocation lies in the arena, the last (past the buffer) on
  // the heap.
  CHECK(inside(arena, taken.front().data));
  CHECK_FALSE(inside(arena, taken.back().data));
  for (std::size_t i = 0; i < taken.size(); ++i) {
    for (std::size_t b = 0; b < taken[i].bytes; ++b) {
      REQUIRE(taken[i].data[b] == static_cast<std::uint8_t>(i % 251));
    }
  }
}

TEST_CASE("a block larger than the whole buffer comes from the heap") {
  StepArena arena;
  void* small = arena.allocate(16, 8);
  void* large = arena.allocate(4 * StepArena::kInlineBytes, 8);
  CHECK(inside(arena, small));
  CHECK_FALSE(inside(arena, large));
  CHECK(reinterpret_cast<std::uintptr_t>(large) % alignof(std::max_align_t) ==
        0);
  std::memset(large, 1, 4 * StepArena::kInlineBytes);
  // The buffer's room is still there for the next small one.
  CHECK(inside(arena, arena.allocate(16, 8)));
}

TEST_CASE("vectors over the arena keep their elements as they grow and move") {
  StepArena arena;
  std::vector<int, StepAllocator<int>> numbers{StepAllocator<int>(&arena)};
  for (int i = 0; i < 5000; ++i) numbers.push_back(i);  // past the buffer
  std::vector<int, StepAllocator<int>> moved = std::move(numbers);
  REQUIRE(moved.size() == 5000);
  for (int i = 0; i < 5000; ++i)
    REQUIRE(moved[static_cast<std::size_t>(i)] == i);
  CHECK(moved.get_allocator() == StepAllocator<long>(&arena));
  StepArena other;
  CHECK_FALSE(moved.get_allocator() == StepAllocator<int>(&other));
}

TEST_CASE("an allocation that fills the buffer exactly stays inline") {
  StepArena arena;
  void* first = arena.allocate(StepArena::kInlineBytes - 64, 8);
  void* last = arena.allocate(64, 8);
  CHECK(inside(arena, first));
  CHECK(inside(arena, last));
  CHECK(static_cast<std::byte*>(last) ==
        static_cast<std::byte*>(first) + StepArena::kInlineBytes - 64);
  CHECK_FALSE(inside(arena, arena.allocate(1, 1)));
}

TEST_CASE(
    "elements holding vectors of their own survive the outer vector's growth") {
  // An Exchange's transfers each hold a vector of parts, and the vector of
  // transfers grows by moving them.
  struct Holder {
    explicit Holder(StepArena* arena) : items(StepAllocator<int>(arena)) {}
    std::vector<int, StepAllocator<int>> items;
  };
  StepArena arena;
  std::vector<Holder, StepAllocator<Holder>> holders{
      StepAllocator<Holder>(&arena)};
  for (int h = 0; h < 200; ++h) {
    Holder& holder = holders.emplace_back(&arena);
    for (int i = 0; i <= h % 7; ++i) holder.items.push_back(h * 10 + i);
  }
  for (int h = 0; h < 200; ++h) {
    const auto& items = holders[static_cast<std::size_t>(h)].items;
    REQUIRE(items.size() == static_cast<std::size_t>(h % 7 + 1));
    for (int i = 0; i <= h % 7; ++i) {
      REQUIRE(items[static_cast<std::size_t>(i)] == h * 10 + i);
    }
  }
}

TEST_CASE("sizes that overflow are bad_alloc") {
  StepArena arena;
  // Elements whose bytes wrap around to 8: without the allocator's check
  // they would come from the buffer.
  StepAllocator<std::uint64_t> allocator(&arena);
  CHECK_THROWS_AS(allocator.allocate(SIZE_MAX / 8 + 2), std::bad_alloc);
  // Bytes that, with a heap block's header, wrap around.
  CHECK_THROWS_AS(arena.allocate(SIZE_MAX - 8, 8), std::bad_alloc);
}
