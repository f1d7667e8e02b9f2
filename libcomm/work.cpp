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
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    done_.wait(lock, [&] { return completed_; });
  } else if (!done_.wait_for(lock, timeout, [&] { return completed_; })) {
    lock.unlock();
    throw TimeoutError(description() + " did not complete within " +
                       format_duration(timeout) + " of wait()");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

int Work::source_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return source_rank_;
}

void Work::finish(std::exception_ptr error, int source_rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
    completed_ = true;
    error_ = std::move(error);
    source_rank_ = source_rank;
  }
  done_.notify_all();
}

}  // namespace comm
