#include "libcomm/work.h"

#include "libcomm/error.h"

namespace comm {

Work::Work(std::string description)
    : description_(std::move(description)), described_(true) {}
Work::~Work() = default;

std::string Work::describe() const { return "operation"; }

const std::string& Work::description() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!described_) {
    description_ = describe();
    described_ = true;
  }
  return description_;
}

bool Work::wait(Duration timeout) {
  if (timeout == kNoTimeout && !is_completed()) progress();
  if (is_completed()) {
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const auto completed = [&] {
    return completed_.load(std::memory_order_relaxed);
  };
  if (timeout == kNoTimeout) {
    done_.wait(lock, completed);
  } else if (!done_.wait_for(lock, timeout, completed)) {
    lock.unlock();
    throw TimeoutError(description() + " did not complete within " +
                       format_duration(timeout) + " of wait()");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const {
  return completed_.load(std::memory_order_acquire);
}

bool Work::is_success() const { return is_completed() && !error_; }

std::exception_ptr Work::exception() const {
  return is_completed() ? error_ : nullptr;
}

int Work::source_rank() const { return is_completed() ? source_rank_ : -1; }

void Work::finish(std::exception_ptr error, int source_rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_.load(std::memory_order_relaxed)) return;
    error_ = std::move(error);
    source_rank_ = source_rank;
    completed_.store(true, std::memory_order_release);
  }
  done_.notify_all();
}

}  // namespace comm
