// comm::tcp::CollectiveTask: a queued collective of the TCP backend and the
// Work handed to its caller, with what the collective runs, in one
// allocation.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

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

// A task whose body is a `Body`, a callable taking CollectiveContext&, held
// in the task itself: a body in a std::function of its own would cost a
// heap allocation in every call, its captures being larger than the
// function's inline buffer.
template <typename Body>
class CollectiveTaskWith final : public CollectiveTask {
 public:
  CollectiveTaskWith(const CallInfo& info, std::chrono::milliseconds limit,
                     Body body, int rank)
      : CollectiveTask(info, limit, rank), body_(std::move(body)) {}

  void run_body(CollectiveContext& ctx) override {
    struct Destroy {
      std::optional<Body>& body;
      ~Destroy() { body.reset(); }
    } destroy{body_};
    (*body_)(ctx);
  }
  void drop_body() override { body_.reset(); }

 private:
  std::optional<Body> body_;
};

}  // namespace comm::tcp
