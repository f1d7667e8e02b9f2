// comm::Work: the handle of an operation that runs in the background.
//
// Every collective and point-to-point call returns one. The operation keeps
// its tensors alive until it completes. wait() blocks until it does and
// rethrows its failure; is_completed() and is_success() never block.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "libcomm/export.h"

namespace comm {

class COMM_API Work {
 public:
  using Duration = std::chrono::milliseconds;
  // wait() without a timeout waits for the operation, which has a timeout
  // of its own (the options' or the group's).
  static constexpr Duration kNoTimeout = Duration::max();

  // `description` names the operation in errors: "all_reduce #12 (float32
  // x 1024, sum)".
  explicit Work(std::string description);
  virtual ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the operation completes, at most `timeout`. Rethrows the
  // operation's error if it failed; throws TimeoutError naming the
  // operation if it is still running after `timeout` (the operation itself
  // goes on). Returns true.
  //
  // A backend whose operations run on a device may override it: the NCCL
  // backend's unbounded wait() makes the caller's current CUDA stream wait
  // for the operation and returns without blocking the host, as c10d's
  // does.
  virtual bool wait(Duration timeout = kNoTimeout);
  bool is_completed() const;
  // Completed without error.
  bool is_success() const;
  // The error the operation failed with, or null.
  std::exception_ptr exception() const;
  // For a receive from any source, the rank the message came from once the
  // receive completed; -1 otherwise.
  int source_rank() const;

  // Calls `callback` once the operation has completed, with its outcome
  // published (is_completed() true): on the thread that completes it,
  // after the waiters were woken, or at once on this thread where it has
  // completed already. Callbacks run once each; those added before the
  // operation completes run in the order they were added, and one added
  // as it completes may run beside them, on this thread. The thread that
  // completes an operation is the backend's own (a worker, or a caller
  // that runs the operation as it waits), so a callback must be short and
  // must neither block nor call into the operation's group: it hands
  // anything more to a thread of the caller's, as commdist's completion
  // threads do. An exception it throws is logged and dropped.
  void on_completion(std::function<void()> callback);

  // The operation's name, as given or, for a backend that names its
  // operations lazily, as describe() gives it the first time it is asked.
  const std::string& description() const;

  // Completes the operation, with an error or without, and wakes every
  // waiter. Only the first call counts: a later one returns at once, maybe
  // before the first has published the outcome. Safe to call from any
  // thread, concurrently with the Work's other members; the caller keeps
  // the Work alive until the call returns, as waking the waiters follows
  // the completion they may see.
  void finish(std::exception_ptr error = nullptr, int source_rank = -1);

 protected:
  // For a backend that names its operations only when a name is needed (an
  // error, a log line): formatting one for every call that succeeds would
  // cost a good part of a small collective.
  Work() = default;
  // The name description() returns; called at most once, with the Work's
  // description mutex held, so it must not call description().
  virtual std::string describe() const;

  // Called by wait() without a timeout, on the waiting thread, before it
  // blocks: a backend whose caller can run the operation itself does so
  // here, which saves two thread hand-offs for a call the caller waits on
  // anyway. Running it could outlast a bounded wait, so only an unbounded
  // one lends its thread. The default does nothing.
  virtual void progress() {}

 private:
  // Whether `timeout` passed before the operation completed; sleeps on
  // state_ (a futex) meanwhile.
  bool sleep_until_completed(Duration timeout) const;
  // Runs, once each, the callbacks on_completion() has added so far.
  void run_callbacks();

  // Guards only the lazily made description: completing and waiting take
  // no lock, as a small blocking call would spend a good part of its time
  // in them.
  mutable std::mutex description_mutex_;
  mutable std::string description_;  // under description_mutex_
  mutable bool described_ = false;   // under description_mutex_
  // kRunning, then kFinishing while the one finish() that claimed it
  // writes error_ and source_rank_, then kDone, after which they never
  // change: a reader that sees kDone (acquire) reads them without a lock.
  // A 32-bit word, as the futex waiters sleep on it.
  enum : std::uint32_t { kRunning, kFinishing, kDone };
  mutable std::atomic<std::uint32_t> state_{kRunning};
  // Threads asleep, or about to sleep, on state_: finish() makes the wake
  // system call only when there are some.
  mutable std::atomic<std::uint32_t> sleepers_{0};
  std::exception_ptr error_;
  int source_rank_ = -1;
  // on_completion()'s callbacks not yet run; has_callbacks_ lets finish()
  // skip the lock where none was ever added, as for sleepers_.
  std::mutex callbacks_mutex_;
  std::vector<std::function<void()>> callbacks_;  // under callbacks_mutex_
  std::atomic<bool> has_callbacks_{false};
};

}  // namespace comm
