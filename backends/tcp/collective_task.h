// comm::tcp::CollectiveTask: a queued collective of the TCP backend and the
// Work handed to its caller, in one allocation.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "backends/tcp/message_header.h"
#include "libcomm/detail/socket.h"
#include "libcomm/work.h"

namespace comm::tcp {

struct CollectiveContext;
class CollectiveScheduler;

class CollectiveTask final : public Work {
 public:
  // What the task runs: the algorithm with its staging, given the context
  // of the call (its connections, its deadline).
  using Body = std::function<void(CollectiveContext&)>;

  CollectiveTask(const CallInfo& info, std::chrono::milliseconds limit,
                 Body body, int rank,
                 std::weak_ptr<CollectiveScheduler> scheduler)
      : call(info),
        timeout(limit),
        queued_at(detail::Clock::now()),
        body_(std::move(body)),
        rank_(rank),
        scheduler_(std::move(scheduler)) {}

  // Hands the body over, once: it holds the call's tensors, which the Work
  // (that the caller may keep long after) must not keep alive.
  Body take_body() {
    Body body = std::move(body_);
    body_ = nullptr;
    return body;
  }

  const CallInfo call;
  const std::chrono::milliseconds timeout;
  const detail::Clock::time_point queued_at;

 private:
  // Named only when a name is needed (an error, a log line).
  std::string describe() const override {
    return call.describe() + " on rank " + std::to_string(rank_);
  }
  // A caller that waits runs the queue itself (CollectiveScheduler::help).
  void progress() override;

  Body body_;
  const int rank_;
  std::weak_ptr<CollectiveScheduler> scheduler_;
};

}  // namespace comm::tcp
