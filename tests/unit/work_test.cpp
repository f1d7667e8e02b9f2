// comm::Work: what a caller may rely on before and after an operation
// completes, from the thread that completes it and from the others.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/error.h"
#include "libcomm/work.h"

using comm::Work;

TEST_CASE("a pending operation reports nothing and a bounded wait times out") {
  Work work("all_reduce #3 (float32 x 8, sum)");
  CHECK_FALSE(work.is_completed());
  CHECK_FALSE(work.is_success());
  CHECK(work.exception() == nullptr);
  CHECK(work.source_rank() == -1);
  try {
    work.wait(std::chrono::milliseconds(20));
    FAIL("wait() returned before the operation completed");
  } catch (const comm::TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("all_reduce #3"));
  }
}

TEST_CASE("a waiter wakes when another thread completes the operation") {
  Work work("recv #1");
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    work.finish(nullptr, 2);
  });
  CHECK(work.wait(std::chrono::seconds(10)));
  finisher.join();
  CHECK(work.is_completed());
  CHECK(work.is_success());
  CHECK(work.exception() == nullptr);
  CHECK(work.source_rank() == 2);
}

TEST_CASE("a failed operation rethrows its error to every waiter") {
  Work work("broadcast #0");
  work.finish(std::make_exception_ptr(std::runtime_error("peer 1 died")));
  CHECK(work.is_completed());
  CHECK_FALSE(work.is_success());
  REQUIRE(work.exception() != nullptr);
  for (int i = 0; i < 2; ++i) {
    CHECK_THROWS_WITH(work.wait(), "peer 1 died");
    CHECK_THROWS_WITH(work.wait(std::chrono::milliseconds(1)), "peer 1 died");
  }
}

TEST_CASE("the first completion is the one that stands") {
  Work work("send #4");
  work.finish(std::make_exception_ptr(std::runtime_error("first")), 1);
  work.finish(nullptr, 3);
  CHECK_FALSE(work.is_success());
  CHECK(work.source_rank() == 1);
  CHECK_THROWS_WITH(work.wait(), "first");
}

TEST_CASE("a thread that sees the operation completed sees its outcome") {
  // Readers poll without waiting while another thread completes the
  // operations; whoever sees one completed must see its error and source
  // too (ThreadSanitizer checks the ordering in its build).
  constexpr int kWorks = 200;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < kWorks; ++i) {
    works.push_back(std::make_unique<Work>("op #" + std::to_string(i)));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      const auto give_up =
          std::chrono::steady_clock::now() + std::chrono::seconds(30);
      for (int i = 0; i < kWorks; ++i) {
        // Bounded: 30 s in all, far more than the finisher needs.
        while (!works[i]->is_completed() &&
               std::chrono::steady_clock::now() < give_up) {
          std::this_thread::yield();
        }
        if (!works[i]->is_completed()) {
          ++wrong;
          continue;
        }
        const bool failed = i % 2 == 1;
        if (works[i]->is_success() == failed) ++wrong;
        if ((works[i]->exception() != nullptr) != failed) ++wrong;
        if (works[i]->source_rank() != i % 7) ++wrong;
      }
    });
  }
  for (int i = 0; i < kWorks; ++i) {
    works[i]->finish(i % 2 == 1 ? std::make_exception_ptr(std::runtime_error(
                                      "failed " + std::to_string(i)))
                                : nullptr,
                     i % 7);
  }
  for (auto& reader : readers) reader.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("one completion wakes every sleeping waiter, bounded or not") {
  Work work("all_gather #9");
  std::atomic<int> woken{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      // Half wait without a bound (the operation has no progress hook, so
      // they sleep), half with one far longer than the test.
      const bool ok =
          i % 2 == 0 ? work.wait() : work.wait(std::chrono::hours(1));
      if (ok && work.source_rank() == 5) ++woken;
    });
  }
  // Give them time to fall asleep; the outcome does not depend on it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  work.finish(nullptr, 5);
  for (auto& waiter : waiters) waiter.join();
  CHECK(woken.load() == 4);
}

TEST_CASE("a wait that timed out leaves the operation to complete later") {
  Work work("reduce #2");
  CHECK_THROWS_AS(work.wait(std::chrono::milliseconds(5)), comm::TimeoutError);
  std::thread finisher([&] { work.finish(nullptr, 0); });
  CHECK(work.wait(std::chrono::seconds(10)));
  finisher.join();
  CHECK(work.is_success());
}

TEST_CASE("of finishers racing on other threads, exactly one stands") {
  // Each round races two finishers with different outcomes; every waiter
  // must see one of them whole, never the error of one with the source of
  // the other.
  for (int round = 0; round < 200; ++round) {
    Work work("send #" + std::to_string(round));
    std::thread failing([&] {
      work.finish(std::make_exception_ptr(std::runtime_error("lost")), 1);
    });
    std::thread succeeding([&] { work.finish(nullptr, 2); });
    bool succeeded = false;
    try {
      succeeded = work.wait(std::chrono::seconds(10));
    } catch (const std::runtime_error&) {
    }
    failing.join();
    succeeding.join();
    REQUIRE(work.source_rank() == (succeeded ? 2 : 1));
    REQUIRE(work.is_success() == succeeded);
  }
}

TEST_CASE("a bound past the clock's range waits as no bound does") {
  Work work("barrier #1");
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    work.finish(nullptr, 0);
  });
  // As the C API's comm_work_wait passes a caller's huge millisecond count.
  CHECK(work.wait(Work::kNoTimeout - std::chrono::milliseconds(1)));
  finisher.join();
}

TEST_CASE("completion callbacks run once, in order, with the outcome known") {
  Work work("broadcast #4");
  std::vector<int> order;
  std::thread::id ran_on;
  work.on_completion([&] {
    CHECK(work.is_completed());
    CHECK_FALSE(work.is_success());
    order.push_back(1);
    ran_on = std::this_thread::get_id();
  });
  work.on_completion([&] { order.push_back(2); });
  CHECK(order.empty());
  std::thread finisher(
      [&] { work.finish(std::make_exception_ptr(std::runtime_error("x"))); });
  finisher.join();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(ran_on != std::this_thread::get_id());
  work.finish();  // a second completion runs nothing again
  CHECK(order == std::vector<int>{1, 2});
}

TEST_CASE("a callback added after completion runs at once on the caller") {
  Work work("recv #2");
  work.finish(nullptr, 1);
  std::thread::id ran_on;
  work.on_completion([&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("a callback that throws is dropped, and the others still run") {
  Work work("gather #1");
  int ran = 0;
  work.on_completion([] { throw std::runtime_error("a callback's bug"); });
  work.on_completion([&] { ++ran; });
  work.finish();
  CHECK(ran == 1);
  CHECK(work.is_success());
}

TEST_CASE("a callback added as another thread completes runs exactly once") {
  // Each round races on_completion() against finish(); whichever order
  // they land in, the callback runs once. Bounded: 2000 rounds.
  for (int round = 0; round < 2000; ++round) {
    Work work("all_reduce #" + std::to_string(round));
    std::atomic<int> ran{0};
    std::atomic<bool> go{false};
    std::thread finisher([&] {
      while (!go.load()) std::this_thread::yield();
      work.finish();
    });
    go.store(true);
    work.on_completion([&] { ran.fetch_add(1); });
    finisher.join();
    REQUIRE(ran.load() == 1);
  }
}
