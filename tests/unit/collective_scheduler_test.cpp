// comm::tcp::CollectiveScheduler under threads that race: tasks issued from
// several threads, some run at once by their caller (the turn taken without
// the mutex), some queued and run by a caller that waits for them (help())
// or by the worker, run one at a time in the order of their sequence
// numbers, each exactly once; a shutdown fails what is queued, interrupts
// the task that holds the turn and lets it finish, runs nothing after it
// returns, and drops every task's copies of the call's arguments. The
// Execute here runs no body: it records the order, which is what the
// scheduler decides.
#include <catch2/catch.hpp>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp/collective_scheduler.h"
#include "libcomm/error.h"

using comm::tcp::CallInfo;
using comm::tcp::CollectiveContext;
using comm::tcp::CollectiveScheduler;
using comm::tcp::CollectiveTask;
using namespace std::chrono_literals;

namespace {

// What Execute saw, checked once the threads are joined. The counters are
// relaxed, so that they order nothing: `next_sequence` is a plain variable
// that successive tasks read and write on different threads, and only the
// scheduler's turn (its acquire and release) orders those accesses, which
// ThreadSanitizer checks.
struct Record {
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> out_of_order{0};
  std::atomic<int> after_shutdown{0};
  std::atomic<std::uint64_t> executed{0};
  std::atomic<bool> shut_down{false};
  std::uint64_t next_sequence = 0;
  bool gaps_allowed = false;

  void execute(CollectiveTask& task) {
    constexpr auto relaxed = std::memory_order_relaxed;
    if (shut_down.load(relaxed)) after_shutdown.fetch_add(1, relaxed);
    if (running.fetch_add(1, relaxed) != 0) overlaps.fetch_add(1, relaxed);
    const std::uint64_t sequence = task.call.sequence;
    if (gaps_allowed ? sequence < next_sequence : sequence != next_sequence) {
      out_of_order.fetch_add(1, relaxed);
    }
    next_sequence = sequence + 1;
    // Widen the window in which another thread finds the turn held.
    if (sequence % 64 == 0) std::this_thread::yield();
    executed.fetch_add(1, relaxed);
    running.fetch_sub(1, relaxed);
  }
};

// How an issue waits: its caller runs it at once if it can (async_op
// false) and waits; or it is queued and its caller waits without a bound,
// which runs the queue on the caller's thread (help()); or it is queued
// and nobody waits for it until the end (the worker starts it).
enum class Mode { kCallerWaits, kQueuedWaited, kQueuedNotWaited };

Mode mode_of(int thread, int i) {
  return static_cast<Mode>((thread + i * 7) % 3);
}

std::shared_ptr<comm::Work> issue(CollectiveScheduler& scheduler, Mode mode,
                                  const std::shared_ptr<int>& held) {
  return scheduler.enqueue(
      CallInfo{}, 10s, mode == Mode::kCallerWaits,
      [](CollectiveContext&, const std::shared_ptr<int>&) {}, held);
}

}  // namespace

TEST_CASE("tasks from many threads run one at a time in issue order",
          "[tcp][scheduler]") {
  constexpr int kThreads = 4;
  constexpr int kTasksPerThread = 2000;
  Record record;
  auto scheduler = CollectiveScheduler::start(
      0, [&](CollectiveTask& task) { record.execute(task); });
  auto held = std::make_shared<int>(7);
  std::vector<std::vector<std::shared_ptr<comm::Work>>> unwaited(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int thread = 0; thread < kThreads; ++thread) {
    threads.emplace_back([&, thread] {
      try {
        for (int i = 0; i < kTasksPerThread; ++i) {
          const Mode mode = mode_of(thread, i);
          auto work = issue(*scheduler, mode, held);
          if (mode == Mode::kQueuedNotWaited) {
            unwaited[thread].push_back(std::move(work));
          } else {
            // Unbounded, so that a queued task is run here (help()); meson's
            // timeout bounds the case should the scheduler hang.
            work->wait();
          }
        }
      } catch (const std::exception& e) {
        errors[thread] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (int thread = 0; thread < kThreads; ++thread) {
    INFO("thread " << thread);
    CHECK(errors[thread] == "");
    for (const auto& work : unwaited[thread]) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      REQUIRE_NOTHROW(work->wait(std::max(left, 0ms)));
    }
  }
  CHECK(record.executed.load() == kThreads * kTasksPerThread);
  CHECK(record.overlaps.load() == 0);
  CHECK(record.out_of_order.load() == 0);
  // Every task dropped its copy of the call's arguments once it ran, though
  // the Works are still held.
  CHECK(held.use_count() == 1);
  CHECK(scheduler->shutdown());
  CHECK_FALSE(scheduler->shutdown());
}

TEST_CASE("shutdown fails the queued tasks and interrupts the running one",
          "[tcp][scheduler]") {
  Record record;
  record.gaps_allowed = true;
  std::atomic<bool> blocking{false};
  std::atomic<bool> interrupted{false};
  CollectiveScheduler* self = nullptr;
  auto scheduler = CollectiveScheduler::start(0, [&](CollectiveTask& task) {
    record.execute(task);
    if (task.call.sequence != 0) return;
    // The first task waits for the shutdown's interrupt, as a collective
    // waiting for its peers does, for 10 s at most.
    blocking = true;
    pollfd interrupt{self->interrupt_fd(), POLLIN, 0};
    interrupted = ::poll(&interrupt, 1, 10000) == 1;
    throw comm::BackendError("interrupted");
  });
  self = scheduler.get();
  auto held = std::make_shared<int>(7);
  auto first = issue(*scheduler, Mode::kQueuedNotWaited, held);
  // The worker starts it after the grace; wait for that, 10 s at most.
  for (int i = 0; i < 10000 && !blocking; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(blocking);
  auto second = issue(*scheduler, Mode::kQueuedNotWaited, held);
  auto third = issue(*scheduler, Mode::kCallerWaits, held);  // queued too
  CHECK_FALSE(second->is_completed());
  CHECK_FALSE(third->is_completed());
  CHECK(scheduler->shutdown());
  CHECK(interrupted);
  // The two queued ones were dropped unrun, and counted so (a departure
  // names them); the interrupted one ran.
  CHECK(scheduler->abandoned() == 2);
  CHECK_THROWS_AS(issue(*scheduler, Mode::kCallerWaits, held),
                  comm::BackendError);
  CHECK_THROWS_AS(issue(*scheduler, Mode::kQueuedNotWaited, held),
                  comm::BackendError);
  for (const auto& work : {first, second, third}) {
    REQUIRE(work->is_completed());
    CHECK_FALSE(work->is_success());
  }
  CHECK(record.executed.load() == 1);
  CHECK(held.use_count() == 1);
}

TEST_CASE("a shutdown that races with issuers leaves no task behind",
          "[tcp][scheduler]") {
  constexpr int kThreads = 3;
  constexpr int kMostTasksPerThread = 200000;
  for (int round = 0; round < 5; ++round) {
    INFO("round " << round);
    Record record;
    record.gaps_allowed = true;  // abandoned tasks never run
    auto scheduler = CollectiveScheduler::start(
        0, [&](CollectiveTask& task) { record.execute(task); });
    auto held = std::make_shared<int>(7);
    std::vector<std::vector<std::shared_ptr<comm::Work>>> works(kThreads);
    std::vector<std::string> errors(kThreads);
    std::atomic<int> refused{0};
    std::atomic<int> started{0};
    std::vector<std::thread> threads;
    for (int thread = 0; thread < kThreads; ++thread) {
      threads.emplace_back([&, thread] {
        ++started;
        for (int i = 0; i < kMostTasksPerThread; ++i) {
          const Mode mode = mode_of(thread, i);
          std::shared_ptr<comm::Work> work;
          try {
            work = issue(*scheduler, mode, held);
          } catch (const comm::BackendError&) {
            ++refused;  // shut down: the issue is refused, as it should be
            return;
          } catch (const std::exception& e) {
            errors[thread] = e.what();
            return;
          }
          // A task waited on completes: it runs, or the shutdown fails it.
          if (mode != Mode::kQueuedNotWaited) {
            try {
              work->wait();
            } catch (const std::exception&) {
              // Failed by the shutdown; counted below.
            }
          }
          works[thread].push_back(std::move(work));
        }
        errors[thread] = "never refused: the shutdown came too late";
      });
    }
    while (started.load() < kThreads) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + 3 * round));
    CHECK(scheduler->shutdown());
    record.shut_down = true;
    for (std::thread& t : threads) t.join();
    std::uint64_t succeeded = 0;
    for (int thread = 0; thread < kThreads; ++thread) {
      INFO("thread " << thread);
      CHECK(errors[thread] == "");
      for (const auto& work : works[thread]) {
        // Done by now: run, refused, or failed by the shutdown.
        REQUIRE(work->is_completed());
        if (work->is_success()) ++succeeded;
      }
    }
    CHECK(refused.load() == kThreads);
    CHECK(record.after_shutdown.load() == 0);
    CHECK(record.overlaps.load() == 0);
    CHECK(record.out_of_order.load() == 0);
    // A task succeeds exactly when it ran.
    CHECK(succeeded == record.executed.load());
    CHECK(held.use_count() == 1);
  }
}
