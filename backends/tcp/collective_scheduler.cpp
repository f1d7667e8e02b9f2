#include "backends/tcp/collective_scheduler.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

#include "libcomm/error.h"

namespace comm::tcp {
namespace {

// Sets `timer` (a timerfd) to fire once after `delay`, or disarms it when
// `delay` is zero.
void arm_timer(int timer, std::chrono::nanoseconds delay) {
  itimerspec when{};
  if (delay.count() > 0) {
    when.it_value.tv_sec = static_cast<time_t>(delay.count() / 1000000000);
    when.it_value.tv_nsec = static_cast<long>(delay.count() % 1000000000);
  }
  timerfd_settime(timer, 0, &when, nullptr);
}

// What an issue after shutdown() gets.
[[noreturn]] void throw_shut_down() {
  throw BackendError("the process group was shut down; create a new one");
}

}  // namespace

void CollectiveTask::progress() {
  if (auto alive = scheduler_.lock()) alive->help(*this);
}

CollectiveScheduler::CollectiveScheduler(int rank, Execute execute)
    : rank_(rank), execute_(std::move(execute)) {
  interrupt_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (interrupt_fd_ < 0) throw SystemError(errno, "eventfd");
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0) {
    const int error = errno;
    close(interrupt_fd_);
    throw SystemError(error, "timerfd_create");
  }
}

std::shared_ptr<CollectiveScheduler> CollectiveScheduler::start(
    int rank, Execute execute) {
  std::shared_ptr<CollectiveScheduler> scheduler(
      new CollectiveScheduler(rank, std::move(execute)));
  CollectiveScheduler* self = scheduler.get();
  scheduler->worker_ = std::thread([self] { self->run_worker(); });
  return scheduler;
}

CollectiveScheduler::~CollectiveScheduler() {
  // The last owner is the backend, or a Work's progress hook after the
  // backend shut the scheduler down; the worker never owns it.
  shutdown();
  close(timer_fd_);
  close(interrupt_fd_);
}

std::optional<CollectiveScheduler::Turn> CollectiveScheduler::take_turn(
    CallInfo& call) {
  std::uint64_t state = state_.load(std::memory_order_relaxed);
  // Bounded: each failed exchange saw another thread change the word, and
  // the loop ends once a task is queued, the turn is taken or shutdown
  // begins.
  while (true) {
    if ((state & kStopping) != 0) {
      throw_shut_down();
    }
    if ((state & (kRunning | kQueued)) != 0) return std::nullopt;
    // Acquires what the last holder of the turn did.
    if (state_.compare_exchange_weak(state, (state + kOneSequence) | kRunning,
                                     std::memory_order_acquire,
                                     std::memory_order_relaxed)) {
      call.sequence = state / kOneSequence;
      return std::optional<Turn>(std::in_place, *this);
    }
  }
}

CollectiveScheduler::Turn::~Turn() {
  std::atomic<std::uint64_t>& state = scheduler_.state_;
  std::uint64_t now = state.load(std::memory_order_relaxed);
  while ((now & (kQueued | kStopping)) == 0) {
    // Nothing queued meanwhile and nobody stopping: only the turn changes,
    // and releases what this thread did with it.
    if (state.compare_exchange_weak(now, now & ~kRunning,
                                    std::memory_order_release,
                                    std::memory_order_relaxed)) {
      return;
    }
  }
  std::lock_guard<std::mutex> lock(scheduler_.mutex_);
  scheduler_.end_turn();
  if ((state.load(std::memory_order_relaxed) & (kStopping | kQueued)) ==
      kQueued) {
    scheduler_.wake_worker_later();
  }
}

void CollectiveScheduler::submit(const std::shared_ptr<CollectiveTask>& task) {
  std::chrono::nanoseconds arm{0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // kQueued and kStopping are this thread's to change under the mutex;
    // the turn and the sequence may change meanwhile, hence the loop, which
    // ends once no other thread changes the word between its load and its
    // exchange.
    std::uint64_t state = state_.load(std::memory_order_relaxed);
    do {
      if ((state & kStopping) != 0) {
        throw_shut_down();
      }
    } while (!state_.compare_exchange_weak(
        state, (state + kOneSequence) | kQueued, std::memory_order_relaxed,
        std::memory_order_relaxed));
    task->call.sequence = state / kOneSequence;
    task->queue(detail::Clock::now(), weak_from_this());
    queue_.push_back(task);
    arm = claim_timer();
  }
  if (arm.count() > 0) arm_timer(timer_fd_, arm);
}

std::shared_ptr<CollectiveTask> CollectiveScheduler::start_queued() {
  // With the queue not empty, kQueued is set, so no other thread changes
  // the word but to clear kRunning under the mutex, which this one holds.
  const std::uint64_t state = state_.load(std::memory_order_acquire);
  if (queue_.empty() || (state & (kRunning | kStopping)) != 0) return nullptr;
  std::shared_ptr<CollectiveTask> task = std::move(queue_.front());
  queue_.pop_front();
  const std::uint64_t queued = queue_.empty() ? 0 : kQueued;
  state_.store((state & ~kQueued) | queued | kRunning,
               std::memory_order_relaxed);
  return task;
}

void CollectiveScheduler::end_turn() {
  // Releases what this thread did with the turn to the next thread that
  // takes it, with or without the mutex.
  const std::uint64_t state =
      state_.fetch_and(~kRunning, std::memory_order_release);
  if ((state & kStopping) != 0) {
    changed_.notify_all();  // shutdown() may wait for it
  }
}

void CollectiveScheduler::check_open() const {
  if ((state_.load(std::memory_order_relaxed) & kStopping) != 0) {
    throw_shut_down();
  }
}

std::chrono::nanoseconds CollectiveScheduler::claim_timer() {
  if (timer_armed_) return std::chrono::nanoseconds(0);
  timer_armed_ = true;
  return grace_;
}

void CollectiveScheduler::wake_worker_later() {
  const std::chrono::nanoseconds delay = claim_timer();
  if (delay.count() > 0) arm_timer(timer_fd_, delay);
}

void CollectiveScheduler::help(Work& target) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!target.is_completed()) {
    std::shared_ptr<CollectiveTask> task = start_queued();
    if (!task) break;
    lock.unlock();
    run(*task);
    lock.lock();
    end_turn();
  }
  // Whatever is left belongs to the worker.
  if ((state_.load(std::memory_order_relaxed) & (kStopping | kQueued)) ==
      kQueued) {
    wake_worker_later();
  }
}

void CollectiveScheduler::run_worker() {
  pollfd watched[2] = {{timer_fd_, POLLIN, 0}, {interrupt_fd_, POLLIN, 0}};
  // Runs until shutdown; each round sleeps in poll until the timer says a
  // task has waited its grace, or the scheduler shuts down.
  while (true) {
    if (::poll(watched, 2, -1) < 0 && errno != EINTR) return;
    if (watched[1].revents != 0) return;
    std::uint64_t expirations;
    (void)!read(timer_fd_, &expirations, sizeof(expirations));
    std::unique_lock<std::mutex> lock(mutex_);
    timer_armed_ = false;
    bool started = false;
    std::chrono::nanoseconds rearm{0};
    while (true) {
      const std::uint64_t state = state_.load(std::memory_order_relaxed);
      if ((state & (kRunning | kStopping)) != 0 || queue_.empty()) break;
      const auto due = queue_.front()->queued_at() + grace_;
      const auto now = detail::Clock::now();
      if (now < due) {
        // Armed below, outside the mutex; nobody else arms it meanwhile.
        rearm = due - now;
        timer_armed_ = true;
        break;
      }
      std::shared_ptr<CollectiveTask> task = start_queued();
      grace_ = kAsyncGrace;  // nobody waited for this one
      started = true;
      lock.unlock();
      run(*task);
      lock.lock();
      end_turn();
    }
    if (!started && rearm.count() == 0) grace_ = kWaitedGrace;  // wasted
    if ((state_.load(std::memory_order_relaxed) & kStopping) != 0) return;
    lock.unlock();
    if (rearm.count() > 0) arm_timer(timer_fd_, rearm);
  }
}

void CollectiveScheduler::run(CollectiveTask& task) {
  std::exception_ptr broken;
  if (is_broken_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    broken = broken_;
  }
  if (broken) {
    task.drop_body();
    try {
      std::rethrow_exception(broken);
    } catch (const std::exception& e) {
      task.finish(std::make_exception_ptr(BackendError(
          task.call.describe() +
          " cannot run: the process group failed earlier: " + e.what())));
    }
    return;
  }
  try {
    execute_(task);
  } catch (...) {
    // The body is gone unless the call failed before it ran.
    task.drop_body();
    const auto error = std::current_exception();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!broken_) broken_ = error;
      is_broken_.store(true, std::memory_order_release);
    }
    task.finish(error);
    return;
  }
  task.drop_body();  // gone already, unless execute_ never ran it
  task.finish();
}

bool CollectiveScheduler::shutdown() {
  std::deque<std::shared_ptr<CollectiveTask>> abandoned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if ((state_.load(std::memory_order_relaxed) & kStopping) != 0) {
      return false;
    }
    state_.fetch_or(kStopping, std::memory_order_relaxed);
    state_.fetch_and(~kQueued, std::memory_order_relaxed);
    abandoned.swap(queue_);
  }
  abandoned_ = abandoned.size();
  const auto error = std::make_exception_ptr(BackendError(
      "the process group was shut down before this operation ran"));
  for (auto& task : abandoned) {
    task->drop_body();
    task->finish(error);
  }
  // Interrupt a collective in progress (on the worker or a waiting
  // caller), wait until its thread gives the turn back, then stop.
  const std::uint64_t one = 1;
  (void)!write(interrupt_fd_, &one, sizeof(one));
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      return (state_.load(std::memory_order_acquire) & kRunning) == 0;
    });
  }
  if (worker_.joinable()) worker_.join();
  return true;
}

}  // namespace comm::tcp
