#include "libcomm/work.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

#include "libcomm/detail/log.h"
#include "libcomm/error.h"

namespace comm {
namespace {

std::uint32_t* futex_word(std::atomic<std::uint32_t>& word) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  return reinterpret_cast<std::uint32_t*>(&word);
}

// Sleeps while `word` holds `expected`, at most `timeout` (none: null), or
// until woken; returns at once if it holds another value. Spurious returns
// are the caller's to handle.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                const timespec* timeout) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT_PRIVATE, expected, timeout,
          nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace

Work::Work(std::string description)
    : description_(std::move(description)), described_(true) {}
Work::~Work() = default;

std::string Work::describe() const { return "operation"; }

const std::string& Work::description() const {
  std::lock_guard<std::mutex> lock(description_mutex_);
  if (!described_) {
    description_ = describe();
    described_ = true;
  }
  return description_;
}

bool Work::sleep_until_completed(Duration timeout) const {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  // A timeout past the clock's range waits as long as no timeout does.
  const bool bounded = timeout < std::chrono::duration_cast<Duration>(
                                     Clock::time_point::max() - now);
  const Clock::time_point deadline =
      bounded ? now + timeout : Clock::time_point::max();
  // Counted before state_ is read again: finish() stores kDone, then reads
  // sleepers_ (both sequentially consistent), so either it sees this
  // sleeper and wakes it, or this thread sees kDone, or the futex finds
  // state_ changed and returns at once.
  sleepers_.fetch_add(1);
  // Bounded by the deadline: every round sleeps until woken, state_
  // changes, or the time left has passed.
  std::uint32_t state;
  while ((state = state_.load()) != kDone) {
    if (!bounded) {
      futex_wait(state_, state, nullptr);
      continue;
    }
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(left);
    const timespec relative{
        static_cast<time_t>(seconds.count()),
        static_cast<long>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(left - seconds)
                .count())};
    futex_wait(state_, state, &relative);
  }
  sleepers_.fetch_sub(1);
  // Completed as the time ran out still counts as completed.
  return state_.load(std::memory_order_acquire) == kDone;
}

bool Work::wait(Duration timeout) {
  if (timeout == kNoTimeout && !is_completed()) progress();
  if (!is_completed() && !sleep_until_completed(timeout)) {
    throw TimeoutError(description() + " did not complete within " +
                       format_duration(timeout) + " of wait()");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const {
  return state_.load(std::memory_order_acquire) == kDone;
}

bool Work::is_success() const { return is_completed() && !error_; }

std::exception_ptr Work::exception() const {
  return is_completed() ? error_ : nullptr;
}

int Work::source_rank() const { return is_completed() ? source_rank_ : -1; }

void Work::finish(std::exception_ptr error, int source_rank) {
  std::uint32_t running = kRunning;
  if (!state_.compare_exchange_strong(running, kFinishing,
                                      std::memory_order_acquire)) {
    return;
  }
  error_ = std::move(error);
  source_rank_ = source_rank;
  state_.store(kDone);
  if (sleepers_.load() != 0) futex_wake_all(state_);
  // As with sleepers_: on_completion() sets has_callbacks_, then reads
  // state_, so either this thread sees its callback or that one sees kDone.
  if (has_callbacks_.load()) run_callbacks();
}

void Work::on_completion(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(callbacks_mutex_);
    callbacks_.push_back(std::move(callback));
  }
  has_callbacks_.store(true);
  if (state_.load() == kDone) run_callbacks();
}

void Work::run_callbacks() {
  // Taken under the lock, so that each runs once, whichever of finish()
  // and on_completion() gets here first; run without it, so that a
  // callback may add another.
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(callbacks_mutex_);
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) {
    try {
      callback();
    } catch (const std::exception& e) {
      COMM_LOG_ERROR("a completion callback of {} threw: {}", description(),
                     e.what());
    } catch (...) {
      COMM_LOG_ERROR("a completion callback of {} threw", description());
    }
  }
}

}  // namespace comm
