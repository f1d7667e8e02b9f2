// comm::Workspace: the temporary buffers of a backend's collectives (a
// reducing receive's chunk, the blocks a reduce_scatter receives, the
// spare accumulator of its ring, an in-place all_to_all's copy of its
// input), kept from one call to the next.
//
// A buffer allocated and freed in every call goes back to the kernel often:
// glibc maps a large allocation on its own and unmaps it when it is freed,
// and trims the top of its heap once enough of it is free. Each call of a
// stream then touches fresh pages, one page fault each, which costs more
// than the copy it was for where faults are slow (a virtual machine):
// bench/README.md has the case that showed it. A workspace keeps what a
// call took, up to a bound, so that a stream of like calls takes the same
// memory each time.
//
// Not thread-safe: one call at a time uses it, from whichever thread runs
// that call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace comm {

class Workspace {
 public:
  // `retained_bytes`: how much memory release() may keep for the calls
  // that follow; what a call takes beyond it is freed when the call ends.
  explicit Workspace(std::size_t retained_bytes)
      : retained_bytes_(retained_bytes) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // A buffer of at least `bytes`, uninitialised, that overlaps no other
  // buffer taken since the last release(); valid until release(). Null for
  // zero bytes.
  std::uint8_t* take(std::size_t bytes);
  // Ends the call: every buffer taken is given back, and the workspace
  // keeps the largest of its blocks that fit in `retained_bytes` together.
  void release();

  // The bytes the workspace holds, taken or not.
  std::size_t held_bytes() const;

 private:
  struct Block {
    std::unique_ptr<std::uint8_t[]> data;
    std::size_t bytes = 0;
  };

  const std::size_t retained_bytes_;
  // blocks_[0, taken_) are taken in the current call; the rest are free.
  std::vector<Block> blocks_;
  std::size_t taken_ = 0;
};

// Takes `bytes` from a workspace for one scope of an algorithm and gives
// nothing back by itself: the workspace is released when the call ends.
// Where there is no workspace (null), owns a buffer of its own instead.
class WorkspaceBuffer {
 public:
  WorkspaceBuffer() = default;
  WorkspaceBuffer(Workspace* workspace, std::size_t bytes);
  std::uint8_t* get() const { return data_; }

 private:
  std::unique_ptr<std::uint8_t[]> owned_;
  std::uint8_t* data_ = nullptr;
};

}  // namespace comm
