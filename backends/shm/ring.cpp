#include "backends/shm/ring.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <string>

#include "backends/shm/doorbell.h"
#include "libcomm/detail/copy_bytes.h"
#include "libcomm/error.h"

namespace comm::shm {

namespace {

long membarrier(int command) {
  return ::syscall(SYS_membarrier, command, 0, 0);
}

// A write of this many bytes or fewer looks at the reader's head every
// time, so that it can rewind an empty ring (see ring.h).
constexpr std::size_t kSmallWrite = 4096;

}  // namespace

bool enable_waiter_barrier() {
  static const bool enabled = [] {
    const long offered = membarrier(MEMBARRIER_CMD_QUERY);
    return offered >= 0 && (offered & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0 &&
           (offered & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0 &&
           membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
  }();
  return enabled;
}

// Store the counter (release: the bytes are in place, or copied out, before
// the other end sees it), order, load the other end's flag (see ring.h).
void Ring::move_and_wake(std::atomic<std::uint64_t>& counter,
                         std::uint64_t value,
                         const std::atomic<std::uint32_t>& waiting) const {
  counter.store(value, std::memory_order_release);
  if (waking_ == Waking::kFenced) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else {
    // The waiter's barrier orders the two on the CPU; only the compiler
    // must keep them in this order.
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  if (waiting.load(std::memory_order_relaxed) != 0) {
    Doorbell::ring(peer_doorbell_);
  }
}

void order_before_sleep(Waking waking) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waking == Waking::kWaiterBarrier &&
      membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) {
    throw SystemError(errno, "shared memory: membarrier");
  }
}

std::size_t ring_footprint(std::size_t capacity) {
  return sizeof(RingControl) + (capacity + 63) / 64 * 64;
}

Ring::Ring(void* control, std::size_t capacity, int peer_doorbell,
           Waking waking)
    : control_(static_cast<RingControl*>(control)),
      data_(static_cast<std::uint8_t*>(control) + sizeof(RingControl)),
      capacity_(capacity),
      peer_doorbell_(peer_doorbell),
      waking_(waking) {
  if (!std::has_single_bit(capacity) || capacity < 64) {
    throw InvalidArgument("shared memory: a ring of " +
                          std::to_string(capacity) +
                          " bytes; rings hold a power of two of bytes, at "
                          "least 64");
  }
}

std::size_t Ring::write(const iovec* iov, int count,
                        std::size_t publish_every) {
  std::uint64_t tail = control_->tail.load(std::memory_order_relaxed);
  std::size_t at = offset_of(tail);
  std::size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  // The head last seen (see ring.h), unless the write is small, or it
  // leaves too little room, or this view has not seen one since the ring
  // was written through another. So a write of some bytes that returns 0
  // has seen the reader's true head.
  const auto seen = static_cast<std::size_t>(tail - known_head_);
  if (total <= kSmallWrite || seen > capacity_ || total > capacity_ - seen) {
    // Acquire: the reader has finished copying out the bytes it freed.
    known_head_ = control_->head.load(std::memory_order_acquire);
  }
  const std::uint64_t head = known_head_;
  // A write that finds the ring empty and fits before the current offset
  // starts again at the ring's first byte, so that small messages keep
  // landing on the same cache lines rather than walking the whole ring
  // through cold memory. The skipped bytes count as written until the
  // reader, which finds rewound_at equal to its head, skips them too.
  if (head == tail && at != 0 && total > 0 && total + rewind_room() <= at) {
    control_->rewound_at.store(tail + 1, std::memory_order_relaxed);
    tail += capacity_ - at;
    at = 0;
  }
  std::size_t room = capacity_ - static_cast<std::size_t>(tail - head);
  // The common case, a message that fits whole without wrapping, published
  // once at its end.
  if (publish_every == 0 && total <= room && total <= capacity_ - at) {
    std::uint8_t* to = data_ + at;
    for (int i = 0; i < count; ++i) {
      detail::copy_bytes(to, static_cast<const std::uint8_t*>(iov[i].iov_base),
                         iov[i].iov_len);
      to += iov[i].iov_len;
    }
    if (total > 0) {
      move_and_wake(control_->tail, tail + total, control_->reader_waiting);
    }
    return total;
  }
  // Without publish_every, one publication at the end: a write reaches
  // `capacity_` bytes only with its last byte.
  const std::size_t every = publish_every > 0 ? publish_every : capacity_;
  std::size_t moved = 0;
  std::size_t published = 0;
  for (int i = 0; i < count && room > 0; ++i) {
    const auto* from = static_cast<const std::uint8_t*>(iov[i].iov_base);
    std::size_t left = std::min(iov[i].iov_len, room);
    room -= left;
    while (left > 0) {
      const std::size_t piece =
          std::min({left, capacity_ - at, published + every - moved});
      detail::copy_bytes(data_ + at, from, piece);
      from += piece;
      left -= piece;
      moved += piece;
      at = at + piece == capacity_ ? 0 : at + piece;
      if (moved - published == every) {
        move_and_wake(control_->tail, tail + moved, control_->reader_waiting);
        published = moved;
      }
    }
  }
  if (moved > published) {
    move_and_wake(control_->tail, tail + moved, control_->reader_waiting);
  }
  return moved;
}

std::uint64_t Ring::next_to_read(std::uint64_t head, std::uint64_t tail) const {
  if (tail != head &&
      control_->rewound_at.load(std::memory_order_relaxed) == head + 1) {
    return head + (capacity_ - offset_of(head));
  }
  return head;
}

std::size_t Ring::read(const iovec* iov, int count) {
  // Acquire: the writer's bytes, and its rewound_at, are visible up to the
  // tail read here.
  const std::uint64_t tail = control_->tail.load(std::memory_order_acquire);
  const std::uint64_t head =
      next_to_read(control_->head.load(std::memory_order_relaxed), tail);
  std::size_t there = static_cast<std::size_t>(tail - head);
  std::size_t at = offset_of(head);
  if (there == 0) return 0;
  std::size_t wanted = 0;
  for (int i = 0; i < count; ++i) wanted += iov[i].iov_len;
  // The common case: everything asked for has arrived, without wrapping.
  if (wanted <= there && wanted <= capacity_ - at) {
    const std::uint8_t* from = data_ + at;
    for (int i = 0; i < count; ++i) {
      detail::copy_bytes(static_cast<std::uint8_t*>(iov[i].iov_base), from,
                         iov[i].iov_len);
      from += iov[i].iov_len;
    }
    if (wanted > 0) {
      move_and_wake(control_->head, head + wanted, control_->writer_waiting);
    }
    return wanted;
  }
  std::size_t moved = 0;
  for (int i = 0; i < count && there > 0; ++i) {
    auto* to = static_cast<std::uint8_t*>(iov[i].iov_base);
    std::size_t left = std::min(iov[i].iov_len, there);
    there -= left;
    moved += left;
    while (left > 0) {
      const std::size_t piece = std::min(left, capacity_ - at);
      detail::copy_bytes(to, data_ + at, piece);
      to += piece;
      left -= piece;
      at = at + piece == capacity_ ? 0 : at + piece;
    }
  }
  // Some bytes moved: the ring held some, and the call asked for more than
  // it held, or for bytes that wrap.
  move_and_wake(control_->head, head + moved, control_->writer_waiting);
  return moved;
}

std::span<const std::uint8_t> Ring::peek() const {
  const std::uint64_t tail = control_->tail.load(std::memory_order_acquire);
  const std::uint64_t head =
      next_to_read(control_->head.load(std::memory_order_relaxed), tail);
  const auto at = offset_of(head);
  return {data_ + at,
          std::min(static_cast<std::size_t>(tail - head), capacity_ - at)};
}

void Ring::consume(std::size_t bytes) {
  if (bytes == 0) return;
  // The ring holds unread bytes, so the writer has not rewound since
  // peek(): the same skip applies.
  const std::uint64_t tail = control_->tail.load(std::memory_order_acquire);
  const std::uint64_t head =
      next_to_read(control_->head.load(std::memory_order_relaxed), tail);
  move_and_wake(control_->head, head + bytes, control_->writer_waiting);
}

bool Ring::readable() const {
  return control_->tail.load(std::memory_order_acquire) !=
         control_->head.load(std::memory_order_relaxed);
}

bool Ring::writable() const {
  return control_->tail.load(std::memory_order_relaxed) -
             control_->head.load(std::memory_order_acquire) <
         capacity_;
}

void Ring::raise_reader_flag() {
  control_->reader_waiting.store(1, std::memory_order_relaxed);
}

void Ring::raise_writer_flag() {
  control_->writer_waiting.store(1, std::memory_order_relaxed);
}

// Store the flag, order, load the other end's counter: see ring.h.
bool Ring::arm_reader() {
  raise_reader_flag();
  order_before_sleep(waking_);
  return reader_must_wait();
}

bool Ring::arm_writer() {
  raise_writer_flag();
  order_before_sleep(waking_);
  return writer_must_wait();
}

void Ring::disarm_reader() {
  control_->reader_waiting.store(0, std::memory_order_relaxed);
}

void Ring::disarm_writer() {
  control_->writer_waiting.store(0, std::memory_order_relaxed);
}

void Ring::close() {
  if (control_ == nullptr) return;
  // Released, so that a reader that sees the ring closed also sees every
  // byte published before (Exchange reads what is left before it calls a
  // closed ring an ended connection); the fence then orders the store
  // before the doorbell's check for a sleeper, as the cursors' are.
  control_->closed.store(1, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Doorbell::ring(peer_doorbell_);
}

bool Ring::closed() const {
  return control_->closed.load(std::memory_order_acquire) != 0;
}

}  // namespace comm::shm
