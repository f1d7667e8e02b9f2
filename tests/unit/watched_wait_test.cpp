// Waits on a store that watch something besides it: multi_get_watched
// (watched_wait.h) on every kind of store, and a StoreBarrier's watch.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "libcomm/error.h"
#include "store/hash_store.h"
#include "store/store_barrier.h"
#include "store/tcp_store.h"
#include "store/watched_wait.h"
#include "support/forwarding_store.h"

using comm::Store;
using comm::to_bytes;
using namespace std::chrono_literals;

namespace {

// A store over another that says a timed-out wait leaves it out of step,
// as one over PyTorch's does, and counts the timed waits that ran out on
// it, which a caller of such a store must not make.
class StoreOutOfStepAfterTimeout final : public comm::testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  int timed_out = 0;

 private:
  template <typename Wait>
  auto counted(Wait&& wait) {
    try {
      return wait();
    } catch (const comm::TimeoutError&) {
      ++timed_out;
      throw;
    }
  }
  bool do_resumes_after_timeout() override { return false; }
  comm::Bytes do_get(const std::string& key, Duration timeout) override {
    return counted([&] { return ForwardingStore::do_get(key, timeout); });
  }
  void do_wait(const std::vector<std::string>& keys,
               Duration timeout) override {
    counted([&] {
      ForwardingStore::do_wait(keys, timeout);
      return 0;
    });
  }
  std::vector<comm::Bytes> do_multi_get(const std::vector<std::string>& keys,
                                        Duration timeout) override {
    return counted(
        [&] { return ForwardingStore::do_multi_get(keys, timeout); });
  }
};

// A store over another whose waits and asks fail, as a client's do once
// the server has gone.
class StoreThatFails final : public comm::testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

 private:
  std::vector<comm::Bytes> do_multi_get(const std::vector<std::string>&,
                                        Duration) override {
    throw comm::BackendError("the store's server went away");
  }
  bool do_check(const std::vector<std::string>&) override {
    throw comm::BackendError("the store's server went away");
  }
};

// Two clients of one store of `kind`: a HashStore; a TCPStore whose server
// the first hosts in this process; or, "out of step", the first a
// StoreOutOfStepAfterTimeout over a HashStore, the second that HashStore.
struct TwoClients {
  std::shared_ptr<Store> first, second;
  StoreOutOfStepAfterTimeout* out_of_step = nullptr;
};

TwoClients two_clients(const std::string& kind) {
  if (kind == "hash" || kind == "out of step") {
    auto store = std::make_shared<comm::HashStore>(30s);
    if (kind == "hash") return {store, store};
    auto out_of_step = std::make_shared<StoreOutOfStepAfterTimeout>(*store);
    // The first client keeps the HashStore alive through the second.
    return {out_of_step, store, out_of_step.get()};
  }
  comm::TCPStoreOptions options;
  options.port = 0;
  options.is_server = true;
  options.timeout = 30s;
  options.token = "";
  auto host = std::make_shared<comm::TCPStore>(options);
  options.port = host->port();
  options.is_server = false;
  return {host, std::make_shared<comm::TCPStore>(options)};
}

}  // namespace

TEST_CASE(
    "a watched wait asks its watch between slices and ends where it throws",
    "[store]") {
  const TwoClients clients =
      two_clients(GENERATE(as<std::string>{}, "hash", "tcp", "out of step"));
  Store& store = *clients.first;
  const auto soon = comm::detail::deadline_after(30s);
  SECTION("the value, once a peer sets it, with the watch asked meanwhile") {
    std::thread setter([other = clients.second] {
      std::this_thread::sleep_for(300ms);
      other->set("late", to_bytes("here"));
    });
    int asked = 0;
    const auto values = comm::multi_get_watched(
        store, {"late"}, soon, [&] { ++asked; }, 50ms);
    setter.join();
    CHECK(comm::to_string(values.at(0)) == "here");
    CHECK(asked >= 1);
  }
  SECTION("the watch's error, long before the deadline") {
    int asked = 0;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(comm::multi_get_watched(
                        store, {"never"}, soon,
                        [&] {
                          if (++asked == 3) {
                            throw comm::PeerError(1, "rank 1 died");
                          }
                        },
                        50ms),
                    comm::PeerError);
    CHECK(asked == 3);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  }
  SECTION("a TimeoutError naming the key and the whole wait") {
    try {
      comm::multi_get_watched(
          store, {"never"}, comm::detail::deadline_after(400ms), [] {}, 50ms);
      FAIL("no timeout");
    } catch (const comm::TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains("'never'"));
      // The whole wait, not the last slice's 50 ms.
      CHECK_THAT(e.what(),
                 Catch::Matchers::Matches(
                     "timed out after ([3-9][0-9]{2} ms|[0-9.]+ s) .*"));
    }
  }
  // A store out of step after a timeout is asked, never waited on.
  if (clients.out_of_step != nullptr)
    CHECK(clients.out_of_step->timed_out == 0);
}

TEST_CASE(
    "a barrier's watch ends the wait while the barrier is incomplete, and "
    "not once it has completed",
    "[store]") {
  const TwoClients clients =
      two_clients(GENERATE(as<std::string>{}, "hash", "out of step"));
  Store& store = *clients.first;
  SECTION("incomplete: the watch's error") {
    int asked = 0;
    const comm::StoreBarrier barrier{store, "b/", 0, 2, "test barrier", [&] {
                                       if (++asked == 2)
                                         throw comm::PeerError(1,
                                                               "rank 1 died");
                                     }};
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(comm::arrive_and_wait(barrier, 30s), comm::PeerError);
    CHECK(asked == 2);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  }
  SECTION("complete: the outcome, whatever the watch says after") {
    // The watch lets rank 1 arrive, the last, and then says it died, as a
    // rank does that leaves as soon as it has seen the outcome.
    const comm::StoreBarrier late{*clients.second, "b/", 1, 2, "test barrier"};
    const comm::StoreBarrier barrier{
        store, "b/", 0, 2, "test barrier", [&] {
          REQUIRE(comm::arrive_and_wait(late, 10s) == "");
          throw comm::PeerError(1, "rank 1 left");
        }};
    CHECK(comm::arrive_and_wait(barrier, 30s) == "");
  }
  if (clients.out_of_step != nullptr)
    CHECK(clients.out_of_step->timed_out == 0);
}

TEST_CASE("a store that fails asks the watch before its failure is passed on",
          "[store]") {
  comm::HashStore inner(30s);
  StoreThatFails failing(inner);
  const auto soon = comm::detail::deadline_after(30s);
  // The store's server went with a rank that found a peer dead: the death
  // is what the caller hears.
  CHECK_THROWS_AS(
      comm::multi_get_watched(failing, {"key"}, soon,
                              [] { throw comm::PeerError(1, "rank 1 died"); }),
      comm::PeerError);
  // Nobody died: the store's own failure.
  int asked = 0;
  CHECK_THROWS_AS(
      comm::multi_get_watched(failing, {"key"}, soon, [&] { ++asked; }),
      comm::BackendError);
  CHECK(asked == 1);
}

TEST_CASE(
    "a barrier's outcome is there to see without waiting once it completes, "
    "and not before",
    "[store]") {
  const TwoClients clients =
      two_clients(GENERATE(as<std::string>{}, "hash", "out of step"));
  Store& store = *clients.first;
  SECTION("failed") {
    const comm::StoreBarrier barrier{store, "f/", 0, 2, "test barrier"};
    CHECK_FALSE(comm::completed_outcome(barrier).has_value());
    const comm::StoreBarrier failing{*clients.second, "f/", 1, 2,
                                     "test barrier"};
    comm::fail_barrier(failing, "rank 1 cannot listen", 0ms);
    CHECK(comm::completed_outcome(barrier) == "rank 1 cannot listen");
    // Looking counted no one in or out: the rank still meets the outcome
    // where it waits.
    CHECK(comm::arrive_and_wait(barrier, 10s) == "rank 1 cannot listen");
  }
  SECTION("joined") {
    const comm::StoreBarrier barrier{store, "j/", 0, 1, "test barrier"};
    CHECK_FALSE(comm::completed_outcome(barrier).has_value());
    REQUIRE(comm::arrive_and_wait(barrier, 10s) == "");
    CHECK(comm::completed_outcome(barrier) == "");
  }
  if (clients.out_of_step != nullptr)
    CHECK(clients.out_of_step->timed_out == 0);
}

TEST_CASE(
    "a rank that fails a barrier on a death lingers for the live ranks only",
    "[store]") {
  const TwoClients clients =
      two_clients(GENERATE(as<std::string>{}, "hash", "out of step"));
  // Ranks 0 and 1 of 4 both found rank 3 dead; rank 2 arrives, reads the
  // failure and leaves. Rank 3 never will, and rank 0 must not wait out
  // its linger for it.
  const comm::StoreBarrier finder{*clients.first, "d/", 0, 4, "test barrier"};
  const comm::StoreBarrier other_finder{*clients.second, "d/", 1, 4,
                                        "test barrier"};
  const comm::StoreBarrier reader{*clients.second, "d/", 2, 4, "test barrier"};
  std::thread others([&] {
    std::this_thread::sleep_for(100ms);
    comm::fail_barrier(other_finder, "rank 3 died", 0ms, 3);
    CHECK(comm::arrive_and_wait(reader, 10s) == "rank 3 died");
  });
  const auto start = std::chrono::steady_clock::now();
  comm::fail_barrier(finder, "rank 3 died", 20s, 3);
  const auto lingered = std::chrono::steady_clock::now() - start;
  others.join();
  CHECK(lingered < 10s);
  // Each live rank out once, and the dead one once, though two reported it.
  CHECK(clients.second->add("d/left", 0) == 4);
  // A rank that failed and left by itself, then died, and was reported:
  // counted out once.
  const comm::StoreBarrier left_first{*clients.second, "e/", 1, 2,
                                      "test barrier"};
  const comm::StoreBarrier reporter{*clients.first, "e/", 0, 2, "test barrier"};
  comm::fail_barrier(left_first, "rank 1 cannot listen", 0ms);
  comm::fail_barrier(reporter, "rank 1 died", 0ms, 1);
  CHECK(clients.second->add("e/left", 0) == 2);
}

TEST_CASE(
    "a rank that reads a barrier's failure stays until the others have read "
    "it too",
    "[store]") {
  const TwoClients clients =
      two_clients(GENERATE(as<std::string>{}, "hash", "tcp", "out of step"));
  // Rank 2 of 3 fails the barrier; rank 0, which may host the store, reads
  // the failure at once, and must not go on (and take the store down)
  // before rank 1, still on its way, has read it as well.
  const comm::StoreBarrier host{*clients.first, "r/", 0, 3, "test barrier"};
  const comm::StoreBarrier late{*clients.second, "r/", 1, 3, "test barrier"};
  const comm::StoreBarrier failing{*clients.second, "r/", 2, 3, "test barrier"};
  comm::fail_barrier(failing, "rank 2 cannot listen", 0ms);
  std::string seen_late;
  std::thread others([&] {
    std::this_thread::sleep_for(300ms);
    seen_late = comm::arrive_and_wait(late, 10s);
  });
  const auto start = std::chrono::steady_clock::now();
  CHECK(comm::arrive_and_wait(host, 10s) == "rank 2 cannot listen");
  const auto stayed = std::chrono::steady_clock::now() - start;
  // Every rank had left when rank 0 went on, which it did without waiting
  // out its linger.
  CHECK(clients.first->add("r/left", 0) == 3);
  others.join();
  CHECK(seen_late == "rank 2 cannot listen");
  CHECK(stayed < comm::kLingerAfterFailure);
}

TEST_CASE(
    "a barrier's outcome is decided once: a failure posted before the last "
    "arrival stands for every rank",
    "[store]") {
  const TwoClients clients =
      two_clients(GENERATE(as<std::string>{}, "hash", "tcp", "out of step"));
  const comm::StoreBarrier first{*clients.first, "o/", 0, 2, "test barrier"};
  const comm::StoreBarrier second{*clients.second, "o/", 1, 2, "test barrier"};
  std::string seen_by_first;
  std::thread rank0([&] { seen_by_first = comm::arrive_and_wait(first, 10s); });
  // Rank 1 fails, then arrives all the same, the last: its arrival must
  // not turn the failure into a success.
  comm::fail_barrier(second, "rank 1 gave up", 0ms);
  CHECK(comm::arrive_and_wait(second, 10s) == "rank 1 gave up");
  rank0.join();
  CHECK(seen_by_first == "rank 1 gave up");
}
