// comm::shm::Ring: a single-producer single-consumer ring of bytes in memory
// shared by two processes (or two ranks of one process), and the protocol
// by which either end sleeps until the other has moved.
//
// The ring carries a byte stream, exactly what a socket would: one writer
// appends, one reader consumes, in order. Its control block holds two
// monotonic 64-bit counters, `tail` (bytes ever written; only the writer
// stores it) and `head` (bytes ever read; only the reader stores it), each
// on a cache line of its own; the flag each end raises before it sleeps
// (the writer's beside `tail`, the reader's on a line of its own); and a
// `closed` flag either end raises when it goes away.
//
// The writer's view of the head. The reader stores `head` after every
// read, so a writer that loaded it before every write would move its line
// from the reader's core and back once per message. A write of more than
// 4 KiB uses the head the writer last loaded instead, which is never ahead
// of the reader's, and loads it again only when that one leaves too little
// room; a stream of such messages walks through the ring. A smaller write
// loads the head every time, so that it can rewind an empty ring (below):
// for small messages, staying on a few lines did better than saving the
// load. The reader's waiting flag has a line of its own for the same
// reason: the writer looks at it after every publication, and it changes
// only when the reader sleeps or wakes.
//
// Rewinding. A byte's place in the data is its counter modulo the
// capacity, so a stream of small messages would walk the whole ring.
// Instead, a write that loads the head, finds the ring empty and fits
// before the offset it would start at skips to the ring's first byte: it
// records where it skipped (`rewound_at`, beside `tail`) and counts the
// skipped bytes as written. A reader whose head is that offset skips them
// too. Small messages so keep landing on the same few lines, as they would
// in a pool of recycled buffers. Until the reader reaches the skipped bytes
// the ring holds only as much as lay before that offset, so a write
// rewinds only where at least rewind_room() bytes stay free after it:
// messages a reader leaves unread for a while (the confirmations that
// tcp::Exchange reads up to a window of calls late, a window it sizes to
// this room) must not fill the ring, or a writer would wait for a reader
// that waits for it in turn.
//
// Waking. Each end owns a doorbell (an eventfd, see doorbell.h) that it
// polls together with its sockets. An end that must wait raises its
// waiting flag (reader_waiting: "I wait for bytes", writer_waiting: "I
// wait for room"), then looks at the ring again, and sleeps only if it
// still has to wait. The other end, after publishing new bytes or new
// room, looks at the flag and rings the waiter's doorbell if it is raised.
// Both sides store, then issue a sequentially consistent fence, then load
// (waiter: store flag, fence, load counter; mover: store counter, fence,
// load flag). Two such fences are ordered one before the other, and
// whichever of the two threads fences second sees the other's store: so
// either the waiter sees the new counter and does not sleep, or the mover
// sees the raised flag and rings. A wake-up cannot be lost. An eventfd
// keeps a ring that arrives before its owner polls, and a ring nobody
// needed costs one spurious wake-up, so neither side ever clears the
// other's flag.
//
// The mover's fence is the costly one: it waits until the other end's
// core has given up the counter's cache line, on every publication, and a
// small message's time is mostly such waits. So where both ends can
// (Waking::kWaiterBarrier, see enable_waiter_barrier), the mover only
// stores and loads, in that order for the compiler, and the waiter, which
// is about to sleep anyway, makes the kernel run the barrier for it on
// every CPU that runs a registered process (membarrier's
// MEMBARRIER_CMD_GLOBAL_EXPEDITED) between raising its flag and looking at
// the counter. A mover's store and load then either both precede that
// barrier on its CPU (the store is visible to the waiter's look) or the
// load follows it (and sees the flag): the same two cases as with two
// fences, so a wake-up still cannot be lost.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace comm::shm {

// The shared part of one ring; `capacity` data bytes follow it.
struct RingControl {
  alignas(64) std::atomic<std::uint64_t> head;  // written by the reader
  alignas(64) std::atomic<std::uint32_t> reader_waiting;
  alignas(64) std::atomic<std::uint64_t> tail;  // written by the writer
  std::atomic<std::uint32_t> writer_waiting;
  // One more than the stream offset at which the writer last rewound an
  // empty ring to its start (0: never); see Ring::write.
  std::atomic<std::uint64_t> rewound_at;
  alignas(64) std::atomic<std::uint32_t> closed;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "rings across processes need lock-free 64-bit atomics");
static_assert(sizeof(RingControl) == 256);

// How the two ends of a ring order a publication before their look at the
// other end's waiting flag (see "Waking" above). Both ends use the same.
enum class Waking {
  // Each end fences between its store and its load.
  kFenced,
  // The mover does not fence; a waiter raises its flag, then has the
  // kernel run a barrier on every CPU that runs a registered process. Both
  // processes must have registered (enable_waiter_barrier).
  kWaiterBarrier,
};

// Registers this process for waiter barriers, once, and returns whether
// the kernel offers them (Linux 4.16 or later, and no seccomp filter that
// refuses membarrier). Thread-safe.
bool enable_waiter_barrier();

// One end's view of a ring: where it is mapped in this process, and the
// doorbell of the other end. Copyable: it owns nothing.
class Ring {
 public:
  Ring() = default;
  // `control` points to a RingControl followed by `capacity` bytes, already
  // zeroed when the ring is new; `capacity` is a power of two, at least 64
  // (else InvalidArgument), so that a byte's place, its counter modulo the
  // capacity, stays right when the counters wrap around 2^64 (a rewind
  // adds up to a whole capacity to them). `peer_doorbell` is the eventfd
  // this end rings to wake the other end.
  Ring(void* control, std::size_t capacity, int peer_doorbell,
       Waking waking = Waking::kFenced);

  bool valid() const { return control_ != nullptr; }
  Waking waking() const { return waking_; }
  std::size_t capacity() const { return capacity_; }
  // The bytes a rewinding write leaves free: 2 KiB, or a quarter of a
  // smaller ring.
  std::size_t rewind_room() const {
    return std::min<std::size_t>(2048, capacity_ / 4);
  }

  // Writer: copies as many bytes of `iov[0..count)`, in order, as there is
  // room for, publishes them, wakes a reader that waits, and returns how
  // many it copied (0 when the ring is full). With `publish_every` (not 0)
  // it also publishes each time it has copied that many more bytes, so that
  // the reader starts on them while the rest is copied.
  std::size_t write(const iovec* iov, int count, std::size_t publish_every = 0);
  // Reader: copies up to the bytes `iov[0..count)` has room for, in order,
  // frees their room, wakes a writer that waits, and returns how many it
  // copied (0 when the ring is empty).
  std::size_t read(const iovec* iov, int count);

  // Reader, without copying: the bytes that follow the next one to read
  // contiguously in the ring (up to its end; empty when there are none),
  // valid until consume(). consume(n) frees the first n of them, n no more
  // than peek() returned, as read() of n bytes would. So a reader can
  // reduce the bytes where they lie instead of copying them out first.
  std::span<const std::uint8_t> peek() const;
  void consume(std::size_t bytes);

  // Writer: starts bringing in the lines that a small write touches first
  // (the reader's counter, this end's and the ring's first bytes), so that
  // their transfer from the reader's cache overlaps the caller's work.
  void prefetch_write() const {
    __builtin_prefetch(&control_->head, 0, 3);
    __builtin_prefetch(&control_->tail, 1, 3);
    __builtin_prefetch(data_, 1, 3);
  }

  // Whether the reader would read something, or the writer write
  // something, now.
  bool readable() const;
  bool writable() const;

  // Before sleeping on its doorbell: raises this end's waiting flag, orders
  // (order_before_sleep), and returns whether it must still wait (false:
  // the ring moved meanwhile, or closed). The flag stays raised until
  // disarm; a raised flag only costs the other end a doorbell write per
  // publication.
  bool arm_reader();
  bool arm_writer();
  void disarm_reader();
  void disarm_writer();
  // The same in parts, for a thread about to sleep on several rings
  // (arm_all, below): it raises the flag of each, orders once for all of
  // them, then asks each whether it must still wait.
  void raise_reader_flag();
  void raise_writer_flag();
  bool reader_must_wait() const { return !readable() && !closed(); }
  bool writer_must_wait() const { return !writable() && !closed(); }

  // Tells the other end that this one is gone, and wakes it. Idempotent.
  void close();
  bool closed() const;

 private:
  // Where the reader's next byte is: `head`, or past the bytes the writer
  // skipped when it rewound (see "Rewinding" above), given the `tail` it
  // loaded.
  std::uint64_t next_to_read(std::uint64_t head, std::uint64_t tail) const;
  // Where the byte at stream offset `offset` lies in the data.
  std::size_t offset_of(std::uint64_t offset) const {
    return static_cast<std::size_t>(offset & (capacity_ - 1));
  }

  // Stores `value` in this end's `counter`, then wakes the other end if
  // its `waiting` flag is raised.
  void move_and_wake(std::atomic<std::uint64_t>& counter, std::uint64_t value,
                     const std::atomic<std::uint32_t>& waiting) const;

  RingControl* control_ = nullptr;
  // The writer's last look at `head` (see "The writer's view of the head").
  std::uint64_t known_head_ = 0;
  std::uint8_t* data_ = nullptr;
  std::size_t capacity_ = 0;
  int peer_doorbell_ = -1;
  Waking waking_ = Waking::kFenced;
};

// Between raising the waiting flags of rings and looking at them again
// (see "Waking" above): orders every flag this thread raised before every
// look that follows. `waking` is kWaiterBarrier when any of those rings is
// such a ring; then it makes a system call (membarrier), and throws
// SystemError should the kernel refuse it after all.
void order_before_sleep(Waking waking);

// Before a thread sleeps on several rings at once: raises the waiting flag
// of each end it waits on, orders once for all of them (order_before_sleep,
// with a membarrier if any of the rings goes without fences), then returns
// whether every end must still wait (false: one of them moved or closed).
// `for_each_end(visit)` calls visit(Ring&, bool writer) for each end; it
// is called twice, and must visit the same ends both times.
template <typename ForEachEnd>
bool arm_all(ForEachEnd&& for_each_end) {
  Waking waking = Waking::kFenced;
  for_each_end([&](Ring& ring, bool writer) {
    if (writer) {
      ring.raise_writer_flag();
    } else {
      ring.raise_reader_flag();
    }
    if (ring.waking() == Waking::kWaiterBarrier) waking = ring.waking();
  });
  order_before_sleep(waking);
  bool must_wait = true;
  for_each_end([&](Ring& ring, bool writer) {
    if (!(writer ? ring.writer_must_wait() : ring.reader_must_wait())) {
      must_wait = false;
    }
  });
  return must_wait;
}

// The bytes a ring of `capacity` data bytes occupies, its control block
// included, rounded up to a cache line.
std::size_t ring_footprint(std::size_t capacity);

}  // namespace comm::shm
