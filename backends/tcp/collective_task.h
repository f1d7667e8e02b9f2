// comm::tcp::CollectiveTask: a collective of the TCP backend and the Work
// handed to its caller, with what the collective runs, in one allocation:
// its body and copies of the call's tensors while it is queued
// (CollectiveTaskWith), or a reference to a body on the caller's stack when
// it runs before the call returns (CollectiveTaskInPlace).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "backends/tcp/message_header.h"
#include "libcomm/detail/socket.h"
#include "libcomm/work.h"

namespace comm::tcp {

struct CollectiveContext;
class CollectiveScheduler;

class CollectiveTask : public Work {
 public:
  CollectiveTask(const CallInfo& info, std::chrono::milliseconds limit,
                 int rank)
      : call(info), timeout(limit), rank_(rank) {}

  // Runs the body (the algorithm with its staging, given the context of
  // the call: its connections, its deadline), once, and destroys it as it
  // returns or throws: it holds the call's tensors, which the Work (that
  // the caller may keep long after) must not keep alive.
  virtual void run_body(CollectiveContext& ctx) = 0;
  // Destroys the body without running it, for a task that is refused or
  // abandoned. Does nothing once the body is gone.
  virtual void drop_body() = 0;

  // Stamped with the call's sequence number by the scheduler before the
  // task is queued or run; constant from then on.
  CallInfo call;
  const std::chrono::milliseconds timeout;

  // Called by the scheduler, under its mutex, as it queues the task. It
  // records when the task was queued, which the worker reads (under the
  // same mutex) to start it a grace later, and the scheduler that
  // progress() asks to run it for a caller that waits. A task that the
  // scheduler runs at once is never queued: its Work is complete before
  // the caller can wait for it, so it needs neither.
  void queue(detail::Clock::time_point now,
             std::weak_ptr<CollectiveScheduler> scheduler) {
    queued_at_ = now;
    scheduler_ = std::move(scheduler);
  }
  // When queue() was called; meaningless for a task never queued.
  detail::Clock::time_point queued_at() const { return queued_at_; }

 private:
  // Named only when a name is needed (an error, a log line).
  std::string describe() const override {
    return call.describe() + " on rank " + std::to_string(rank_);
  }
  // A caller that waits runs the queue itself (CollectiveScheduler::help).
  void progress() override;

  const int rank_;
  detail::Clock::time_point queued_at_{};
  std::weak_ptr<CollectiveScheduler> scheduler_;
};

// A task whose body is a `Body`, a callable taking CollectiveContext& and
// then a `Held&` for each of `held`, which the task keeps until the body is
// gone: the call's tensors, copied (or moved) into the task because it may
// run after the call returned. Held in the task itself: a body in a
// std::function of its own would cost a heap allocation in every call, its
// captures being larger than the function's inline buffer.
template <typename Body, typename... Held>
class CollectiveTaskWith final : public CollectiveTask {
 public:
  template <typename B, typename... H>
  CollectiveTaskWith(const CallInfo& info, std::chrono::milliseconds limit,
                     int rank, B&& body, H&&... held)
      : CollectiveTask(info, limit, rank) {
    parts_.emplace(std::forward<B>(body), std::forward<H>(held)...);
  }

  void run_body(CollectiveContext& ctx) override {
    struct Destroy {
      std::optional<Parts>& parts;
      ~Destroy() { parts.reset(); }
    } destroy{parts_};
    std::apply([&](Held&... held) { parts_->body(ctx, held...); },
               parts_->held);
  }
  void drop_body() override { parts_.reset(); }

 private:
  struct Parts {
    template <typename B, typename... H>
    explicit Parts(B&& b, H&&... h)
        : body(std::forward<B>(b)), held(std::forward<H>(h)...) {}
    Body body;
    std::tuple<Held...> held;
  };
  std::optional<Parts> parts_;
};

// A task run before the call that issued it returns (the caller waits, and
// the scheduler's turn was free): its body, a callable taking
// CollectiveContext&, stays where the caller made it, with the call's
// tensors by reference, so the call copies none of them. Valid only within
// the call: the body is gone once run_body() or drop_body() returns. One
// type whatever the body, so that every such task fits the block that
// InPlaceTaskAllocator keeps for the next.
class CollectiveTaskInPlace final : public CollectiveTask {
 public:
  template <typename Body>
  CollectiveTaskInPlace(const CallInfo& info, std::chrono::milliseconds limit,
                        int rank, Body& body)
      : CollectiveTask(info, limit, rank),
        body_(&body),
        invoke_([](void* erased, CollectiveContext& ctx) {
          (*static_cast<Body*>(erased))(ctx);
        }) {}

  void run_body(CollectiveContext& ctx) override {
    invoke_(std::exchange(body_, nullptr), ctx);
  }
  void drop_body() override { body_ = nullptr; }

 private:
  void* body_;
  void (*invoke_)(void* body, CollectiveContext& ctx);
};

// The allocator of in-place tasks (with their shared_ptr control block):
// it keeps the last block freed, one for the whole process, and hands it to
// the next task, so that a stream of blocking calls, each of which drops
// its Work before the next, costs no trip through malloc and free. Any
// thread may allocate or free; the block changes hands through one atomic
// exchange, whose release and acquire order the task's last use before its
// next. The cached block is poisoned for AddressSanitizer, so that a use
// after free is caught while the block waits (not once it is reused). Only
// blocks of one object are cached; others go to std::allocator.
template <typename T>
class InPlaceTaskAllocator {
 public:
  using value_type = T;

  InPlaceTaskAllocator() = default;
  template <typename U>
  InPlaceTaskAllocator(const InPlaceTaskAllocator<U>&) {}  // NOLINT

  T* allocate(std::size_t n) {
    if (n == 1) {
      if (void* block = spare_.exchange(nullptr, std::memory_order_acquire)) {
        unpoison(block);
        return static_cast<T*>(block);
      }
    }
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* block, std::size_t n) {
    if (n == 1) {
      poison(block);
      void* empty = nullptr;
      if (spare_.compare_exchange_strong(empty, block,
                                         std::memory_order_release,
                                         std::memory_order_relaxed)) {
        return;
      }
      unpoison(block);
    }
    std::allocator<T>().deallocate(block, n);
  }

  friend bool operator==(const InPlaceTaskAllocator&,
                         const InPlaceTaskAllocator&) {
    return true;
  }

 private:
  static void poison([[maybe_unused]] void* block) {
#if defined(__SANITIZE_ADDRESS__)
    __asan_poison_memory_region(block, sizeof(T));
#endif
  }
  static void unpoison([[maybe_unused]] void* block) {
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(block, sizeof(T));
#endif
  }

  // Still held at exit, and reachable, so not a leak.
  inline static std::atomic<void*> spare_{nullptr};
};

}  // namespace comm::tcp
