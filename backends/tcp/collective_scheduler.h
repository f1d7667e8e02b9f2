// comm::tcp::CollectiveScheduler: runs the TCP backend's collectives one
// at a time, in the order they were issued, on the thread that issues or
// waits for one, or on a worker thread of its own.
//
// One thread at a time holds the turn, so tasks run one after another in
// issue order whichever thread runs them. A caller that waits at once runs
// its task itself (help()), without the two thread hand-offs that cost
// more than a whole small collective, and one that said so as it issued
// the call (async_op false) runs it before enqueue() returns, when nothing
// is queued before it; work nobody waits on is started by the worker.
//
// The worker is woken by a timer, not by every enqueue, and the timer is
// armed lazily: a task that finds it idle arms it for the grace, and nobody
// disarms it, so a stream of waited-on calls costs one timer arm and one
// wake-up per grace rather than system calls and a hand-off per call. The
// grace is kWaitedGrace (1 ms) at start-up and after a wake-up that found
// nothing to start or the turn held by a caller, because such a wasted
// wake-up stalls the thread it preempts; it is kAsyncGrace (100 us) once
// the worker has had to start a task itself. A wake-up that finds a task
// not yet due re-arms for it. bench/README.md ("The TCP backend's tuning")
// has the measurements behind these choices.
//
// The first task that fails breaks the scheduler: every later task fails
// at once with an error naming that first failure, as after an NCCL
// communicator abort. shutdown() fails the queued tasks, interrupts the
// running one and stops the worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "backends/tcp/collective_task.h"

namespace comm::tcp {

class CollectiveScheduler final
    : public std::enable_shared_from_this<CollectiveScheduler> {
 public:
  // Runs a task's body (CollectiveTask::run_body) within the task's
  // timeout; throws the call's error when it fails.
  using Execute = std::function<void(CollectiveTask& task)>;

  // How long a queued task waits for its caller before the worker starts
  // it: kWaitedGrace at start-up and after a wasted wake-up, kAsyncGrace
  // while the worker starts tasks itself.
  static constexpr std::chrono::nanoseconds kAsyncGrace =
      std::chrono::microseconds(100);
  static constexpr std::chrono::nanoseconds kWaitedGrace =
      std::chrono::milliseconds(1);

  // Creates the scheduler of rank `rank` and starts its worker. `execute`
  // is never called once shutdown() has returned. Shared, because the Work
  // handed out reaches it (weakly) and may outlive the backend.
  static std::shared_ptr<CollectiveScheduler> start(int rank, Execute execute);
  // Shuts down if shutdown() was not called.
  ~CollectiveScheduler();
  CollectiveScheduler(const CollectiveScheduler&) = delete;
  CollectiveScheduler& operator=(const CollectiveScheduler&) = delete;

  // Queues a collective whose body is `body`, a callable taking
  // CollectiveContext& and then a reference to each of `held` (see
  // CollectiveTaskWith): stamps `call` with the next sequence number and
  // returns its Work. A queued task keeps copies of `held` (moves, for an
  // rvalue) and of `body` until its body has run or been dropped (refused,
  // or abandoned at shutdown). Throws BackendError once shut down.
  //
  // With `caller_waits` (the options' async_op false: the caller waits for
  // the Work at once, on this thread) and nothing queued or running, the
  // task runs here instead, before enqueue returns, with `body` and `held`
  // where the caller has them (CollectiveTaskInPlace), and its Work comes
  // back completed: the caller would run it in wait() anyway (help()), and
  // running it now saves the queue's round trip, the mutex and the copies.
  // Otherwise it is queued behind the others, as any task is, so calls
  // still run in issue order.
  template <typename Body, typename... Held>
  std::shared_ptr<Work> enqueue(const CallInfo& call,
                                std::chrono::milliseconds timeout,
                                bool caller_waits, Body&& body,
                                Held&&... held) {
    if (caller_waits) {
      // Made before the turn is taken, so that nothing can fail between
      // stamping a sequence number and running the call; a call that finds
      // the turn held frees it and makes the queued kind.
      auto run_in_place = [&](CollectiveContext& ctx) { body(ctx, held...); };
      auto task = std::allocate_shared<CollectiveTaskInPlace>(
          InPlaceTaskAllocator<CollectiveTaskInPlace>(), call, timeout, rank_,
          run_in_place);
      if (auto turn = take_turn(task->call)) {
        run(*task);
        return task;
      }
    }
    auto task = std::make_shared<
        CollectiveTaskWith<std::decay_t<Body>, std::decay_t<Held>...>>(
        call, timeout, rank_, std::forward<Body>(body),
        std::forward<Held>(held)...);
    submit(task);
    return task;
  }

  // Runs queued tasks on the calling thread until `target` completes,
  // unless another thread holds the turn (then the caller just waits).
  void help(Work& target);

  // Throws BackendError once shut down.
  void check_open() const;

  // Whether a task has failed (or was interrupted by shutdown()).
  bool broken() const { return is_broken_.load(std::memory_order_acquire); }

  // Becomes readable when shutdown begins, so that a running task that
  // watches it stops waiting for its peers.
  int interrupt_fd() const { return interrupt_fd_; }

  // Fails the queued tasks, interrupts the running one, waits until its
  // thread gives the turn back and stops the worker. Returns false when the
  // scheduler was already shut down.
  bool shutdown();
  // How many queued tasks shutdown() failed before they ran.
  std::size_t abandoned() const { return abandoned_; }

 private:
  explicit CollectiveScheduler(int rank, Execute execute);
  // The turn that enqueue() takes to run a task on the calling thread.
  // Its destructor gives the turn back and leaves to the worker what was
  // queued meanwhile.
  class Turn {
   public:
    explicit Turn(CollectiveScheduler& scheduler) : scheduler_(scheduler) {}
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    CollectiveScheduler& scheduler_;
  };
  // Takes the turn and stamps `call` with the next sequence number when
  // nothing is queued or running; returns nothing otherwise. Throws
  // BackendError once shut down. Neither this nor the Turn's destructor
  // takes the mutex unless a task was queued or shutdown began meanwhile.
  std::optional<Turn> take_turn(CallInfo& call);
  // Stamps `task` with the next sequence number and queues it.
  void submit(const std::shared_ptr<CollectiveTask>& task);
  // Takes the turn for the task at the front of the queue and pops it, when
  // no thread holds the turn and the scheduler is not stopping; returns
  // null otherwise. Called with `mutex_` held.
  std::shared_ptr<CollectiveTask> start_queued();
  // Gives back the turn, which the calling thread held to run a task, and
  // wakes shutdown() if it waits for it. Called with `mutex_` held.
  void end_turn();
  void run_worker();
  // Runs one task, on whichever thread holds the turn: refuses it when the
  // scheduler is broken, and breaks the scheduler when it fails.
  void run(CollectiveTask& task);
  // The delay the caller, which holds `mutex_`, must arm the timer with:
  // the grace for the first to find it idle, zero (do not arm) for the
  // others. The caller arms it after letting go of the mutex, so that no
  // system call runs inside the critical section that callers and the
  // worker share (waking a waiter that found it taken costs more than a
  // small collective).
  std::chrono::nanoseconds claim_timer();
  // Makes sure the worker looks at the queue within the grace. Called with
  // `mutex_` held, off the hot path.
  void wake_worker_later();

  const int rank_;
  const Execute execute_;
  int timer_fd_ = -1;
  int interrupt_fd_ = -1;
  std::thread worker_;

  // The turn and the sequence numbers, in one word that a caller running
  // its task at once takes and gives back with one atomic operation each,
  // without the mutex: kRunning while a thread holds the turn, kQueued
  // while `queue_` holds a task, kStopping once shutdown() has begun, and
  // above them the next sequence number. kQueued and kStopping change only
  // under `mutex_`, and kRunning changes without it only while both are
  // clear: so whoever holds the mutex and sees either set may change the
  // word as if nobody else could.
  static constexpr std::uint64_t kRunning = 1;
  static constexpr std::uint64_t kQueued = 2;
  static constexpr std::uint64_t kStopping = 4;
  static constexpr std::uint64_t kOneSequence = 8;
  std::atomic<std::uint64_t> state_{0};

  mutable std::mutex mutex_;
  // kRunning went clear while kStopping was set: shutdown() waits for it,
  // and nothing else does.
  std::condition_variable changed_;
  bool timer_armed_ = false;  // set until the worker has seen it fire
  std::chrono::nanoseconds grace_ = kWaitedGrace;
  std::deque<std::shared_ptr<CollectiveTask>> queue_;
  std::exception_ptr broken_;  // the first failure; tasks refuse after it
  // Set once broken_ is, so that run() checks it without the mutex.
  std::atomic<bool> is_broken_{false};
  std::size_t abandoned_ = 0;  // set by shutdown(), on its thread
};

}  // namespace comm::tcp
