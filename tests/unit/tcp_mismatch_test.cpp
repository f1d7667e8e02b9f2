// Ranks that call different collectives, or the same one with different
// arguments, fail with MismatchError naming both calls instead of
// corrupting data or hanging; and shutdown fails pending work promptly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "backends/tcp/exchange.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "libcomm/logging.h"
#include "support/capture_stderr.h"
#include "support/env_is.h"
#include "support/thread_ranks.h"

using comm::DType;
using comm::ProcessGroup;
using comm::ReduceOp;
using comm::Tensor;
using comm::testing::EnvIs;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

namespace {

// Runs `call(rank, group)` on two ranks and returns what each one's wait
// threw ("" when it succeeded).
std::vector<std::string> outcome(
    const std::function<std::shared_ptr<comm::Work>(int, ProcessGroup&)>&
        call) {
  std::vector<std::string> thrown(2);
  auto errors = run_ranks(
      2,
      [&](ProcessGroup& group) {
        try {
          call(group.rank(), group)->wait();
        } catch (const comm::MismatchError& e) {
          thrown[group.rank()] = std::string("MismatchError: ") + e.what();
        }
      },
      10s);
  for (int r = 0; r < 2; ++r) {
    if (!errors[r].empty()) thrown[r] = "other error: " + errors[r];
  }
  return thrown;
}

}  // namespace

TEST_CASE("different counts are a mismatch on both ranks", "[tcp][mismatch]") {
  auto thrown = outcome([](int rank, ProcessGroup& group) {
    Tensor t = Tensor::zeros({rank == 0 ? 10 : 20}, DType::kF32);
    return group.all_reduce(t);
  });
  for (const std::string& text : thrown) {
    CHECK_THAT(text, Catch::StartsWith("MismatchError") &&
                         Catch::Contains("all_reduce #0 (float32 x 10, sum)") &&
                         Catch::Contains("all_reduce #0 (float32 x 20, sum)"));
  }
}

TEST_CASE("a failure the caller is told of is not also logged as an error",
          "[tcp][mismatch]") {
  // The exception carries the text; at the default level the log stays
  // quiet, where it once repeated each failure as an error.
  const comm::LogLevel level = comm::log_level();
  comm::set_log_level(comm::LogLevel::kWarn);
  std::vector<std::string> thrown;
  const std::string log = comm::testing::capture_stderr([&] {
    thrown = outcome([](int rank, ProcessGroup& group) {
      Tensor t = Tensor::zeros({rank == 0 ? 10 : 20}, DType::kF32);
      return group.all_reduce(t);
    });
  });
  comm::set_log_level(level);
  for (const std::string& text : thrown) {
    CHECK_THAT(text, Catch::StartsWith("MismatchError"));
  }
  CHECK_THAT(log, !Catch::Contains("all_reduce #0 (float32 x"));
}

TEST_CASE("different dtypes, ops and collectives are mismatches",
          "[tcp][mismatch]") {
  SECTION("dtype") {
    auto thrown = outcome([](int rank, ProcessGroup& group) {
      Tensor t = Tensor::zeros({8}, rank == 0 ? DType::kF32 : DType::kI32);
      return group.all_reduce(t);
    });
    for (const auto& text : thrown) {
      CHECK_THAT(
          text, Catch::Contains("float32 x 8") && Catch::Contains("int32 x 8"));
    }
  }
  SECTION("op") {
    auto thrown = outcome([](int rank, ProcessGroup& group) {
      Tensor t = Tensor::zeros({8}, DType::kF32);
      return group.all_reduce(t, {rank == 0 ? ReduceOp::kSum : ReduceOp::kMax});
    });
    for (const auto& text : thrown) {
      CHECK_THAT(text, Catch::Contains("sum)") && Catch::Contains("max)"));
    }
  }
  SECTION("collective") {
    auto thrown = outcome([](int rank, ProcessGroup& group) {
      Tensor t = Tensor::zeros({8}, DType::kF32);
      if (rank == 0) return group.all_reduce(t);
      std::vector<Tensor> outputs = {Tensor::zeros({8}, DType::kF32),
                                     Tensor::zeros({8}, DType::kF32)};
      return group.all_gather(outputs, t);
    });
    for (const auto& text : thrown) {
      CHECK_THAT(text, Catch::Contains("all_reduce #0") &&
                           Catch::Contains("all_gather #0"));
    }
  }
  SECTION("root (world 3, where a rank hears from the wrong root)") {
    std::vector<std::string> thrown(3);
    run_ranks(
        3,
        [&](ProcessGroup& group) {
          Tensor t = Tensor::zeros({8}, DType::kF32);
          try {
            group.broadcast(t, {group.rank() == 2 ? 1 : 0})->wait();
            group.barrier()->wait();
          } catch (const comm::Error& e) {
            thrown[group.rank()] = e.what();
          }
        },
        10s);
    // Rank 2 waits for rank 1, which it wrongly takes for the root, and
    // finds rank 1's next call instead; the others learn of it from rank 2.
    CHECK_THAT(thrown[2],
               Catch::Contains("broadcast #0 (float32 x 8, root 1)"));
    for (const auto& text : thrown) CHECK(text != "");  // nobody carries on
  }
}

TEST_CASE("a broadcast that meets a barrier fails on both ranks",
          "[tcp][mismatch]") {
  std::vector<std::string> thrown(2);
  run_ranks(
      2,
      [&](ProcessGroup& group) {
        Tensor t = Tensor::zeros({8}, DType::kF32);
        try {
          // Rank 0's broadcast sends and returns; rank 1 expected a barrier
          // and reads the broadcast's message, and rank 0's barrier reads
          // rank 1's where it expected a confirmation.
          if (group.rank() == 0) {
            group.broadcast(t, {0})->wait();
          } else {
            group.barrier()->wait();
          }
          group.barrier({std::chrono::milliseconds(5000)})->wait();
        } catch (const comm::MismatchError& e) {
          thrown[group.rank()] = e.what();
        }
      },
      10s);
  // Rank 1 sees the broadcast's message where it expected its barrier.
  CHECK_THAT(thrown[1],
             Catch::Contains("broadcast #0") && Catch::Contains("barrier #0"));
  // Rank 0 reads rank 1's barrier #0 where it expected the confirmation,
  // or rank 1's report arrives first; a mismatch either way.
  CHECK_THAT(thrown[0], Catch::Contains("barrier #0"));
}

namespace {

// Runs an all_to_all on three ranks (two keep the rings, reading nothing)
// in which rank 0 sends rank 1 `sent` int32 while rank 1 expects
// `expected` (every other part agrees: one int32), then a barrier, and
// returns what each rank threw ("" if nothing). Rank 0's part for rank 1
// starts with `part`, the rest 7s.
std::vector<std::string> disagreeing_all_to_all(
    std::int64_t sent, std::int64_t expected,
    const std::vector<std::int32_t>& part) {
  std::vector<std::string> thrown(3);
  run_ranks(
      3,
      [&](ProcessGroup& group) {
        const int me = group.rank();
        comm::AllToAllOptions options;
        // Row counts per peer: sent to rank p, received from rank p.
        options.input_split_sizes = {1, me == 0 ? sent : 1, 1};
        options.output_split_sizes = {me == 1 ? expected : 1, 1, 1};
        Tensor input =
            Tensor::full({2 + options.input_split_sizes[1]}, 7, DType::kI32);
        if (me == 0) {
          for (std::size_t i = 0; i < part.size(); ++i) {
            input.data<std::int32_t>()[1 + i] = part[i];
          }
        }
        Tensor output =
            Tensor::zeros({options.output_split_sizes[0] + 2}, DType::kI32);
        try {
          group.all_to_all(output, input, options)->wait();
          // A rank may finish its part of the call before its peer finds
          // the mismatch; its next call then fails.
          group.barrier({std::chrono::milliseconds(5000)})->wait();
        } catch (const comm::MismatchError& e) {
          thrown[group.rank()] = e.what();
        }
      },
      10s);
  return thrown;
}

}  // namespace

TEST_CASE(
    "all_to_all splits that disagree fail, whether a part travels or "
    "is read",
    "[tcp][mismatch][all_to_all]") {
  // Over shared memory, among three ranks, a part of 1 Mi int32 (4 MiB)
  // is read from its sender's memory where the threshold lets three parts
  // of its size (12 MiB) be read, and its sender sends a Region (16 bytes)
  // in its place; a part of 4 int32 (16 bytes) travels. Where the two
  // ends disagree, the message's lengths agree: only its mark as an address
  // tells them apart. Over sockets, and where every part is read, the
  // sizes differ plainly.
  const std::int64_t small = 4;
  const std::int64_t large = 1 << 20;
  // The plain run of this program, over shared memory, is the one where
  // only the mark decides, with the threshold at the large part's; its
  // `_over_tcp` and `_single_copy` copies set their own.
  const bool by_mark =
      std::getenv("COMM_TRANSPORT") == nullptr &&
      std::getenv("COMM_SHM_DIRECT_THRESHOLD_BYTES") == nullptr;
  std::optional<EnvIs> reads_large;
  if (by_mark) {
    reads_large.emplace(
        std::initializer_list<std::pair<const char*, const char*>>{
            {"COMM_SHM_DIRECT_THRESHOLD_BYTES", "12582912"}});
  }
  SECTION("the receiver reads, the sender sends data") {
    // The part's second 8 bytes say 4 MiB, as a Region's size would.
    const auto thrown = disagreeing_all_to_all(
        small, large, {7, 7, static_cast<std::int32_t>(large * 4), 0});
    CHECK_THAT(thrown[1],
               Catch::Contains("all_to_all #0") && Catch::Contains("agree"));
    if (by_mark) {
      CHECK_THAT(thrown[1], Catch::Contains("expects the address of"));
    }
    CHECK_THAT(thrown[0], Catch::Contains("all_to_all #0"));
  }
  SECTION("the sender sends an address, the receiver expects data") {
    const auto thrown = disagreeing_all_to_all(large, small, {});
    CHECK_THAT(thrown[1],
               Catch::Contains("all_to_all #0") && Catch::Contains("agree"));
    if (by_mark) {
      CHECK_THAT(thrown[1], Catch::Contains("sends the address of its part"));
    }
    CHECK_THAT(thrown[0], Catch::Contains("all_to_all #0"));
  }
}

namespace {

enum class Rooted { kBroadcast, kScatter, kReduce, kGather };

const char* rooted_name(Rooted kind) {
  switch (kind) {
    case Rooted::kBroadcast: return "broadcast";
    case Rooted::kScatter: return "scatter";
    case Rooted::kReduce: return "reduce";
    case Rooted::kGather: return "gather";
  }
  return "?";
}

// Runs one rooted collective on every rank with the root `root_of(rank)`,
// then up to kConfirmationWindow + 1 barriers, and returns per rank what the
// collective did: "ok" (its data checked against what its root sent), or
// the error's kind and text; then " | next: " and "ok" when every barrier
// succeeded, or the first barrier's error.
std::vector<std::string> rooted_outcome(int world, Rooted kind,
                                        std::int64_t count,
                                        const std::function<int(int)>& root_of,
                                        std::chrono::milliseconds& slowest) {
  std::vector<std::string> outcome(static_cast<std::size_t>(world));
  std::vector<std::chrono::milliseconds> took(static_cast<std::size_t>(world));
  auto errors = run_ranks(
      world,
      [&](ProcessGroup& group) {
        const int rank = group.rank();
        const int root = root_of(rank);
        std::string& mine = outcome[static_cast<std::size_t>(rank)];
        const auto start = std::chrono::steady_clock::now();
        auto describe = [](const std::exception& e) {
          if (dynamic_cast<const comm::MismatchError*>(&e) != nullptr)
            return std::string("MismatchError: ") + e.what();
          return std::string("other error: ") + e.what();
        };
        try {
          // Rank r contributes r + 1 (per block r * 10 + b for scatter).
          Tensor t = Tensor::full({count}, rank + 1, DType::kF32);
          float expected = static_cast<float>(rank + 1);
          switch (kind) {
            case Rooted::kBroadcast:
              group.broadcast(t, {root})->wait();
              expected = static_cast<float>(root + 1);
              break;
            case Rooted::kScatter: {
              std::vector<Tensor> blocks;
              if (rank == root) {
                for (int b = 0; b < world; ++b)
                  blocks.push_back(
                      Tensor::full({count}, rank * 10 + b, DType::kF32));
              }
              group.scatter(t, blocks, {root})->wait();
              expected = static_cast<float>(root * 10 + rank);
              break;
            }
            case Rooted::kReduce:
              group.reduce(t, {root, ReduceOp::kSum})->wait();
              if (rank == root) expected = world * (world + 1) / 2.0f;
              break;
            case Rooted::kGather: {
              std::vector<Tensor> blocks;
              if (rank == root) {
                for (int b = 0; b < world; ++b)
                  blocks.push_back(Tensor::zeros({count}, DType::kF32));
              }
              group.gather(blocks, t, {root})->wait();
              if (rank == root) {
                for (int b = 0; b < world; ++b) {
                  if (blocks[b].data<float>()[0] != b + 1) expected = -1;
                }
              }
              break;
            }
          }
          mine = t.data<float>()[0] == expected ? "ok" : "WRONG DATA";
        } catch (const std::exception& e) {
          mine = describe(e);
        }
        took[static_cast<std::size_t>(rank)] =
            std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start);
        try {
          for (std::uint64_t b = 0;
               b <= comm::tcp::Exchange::kConfirmationWindow; ++b) {
            group.barrier({std::chrono::milliseconds(5000)})->wait();
          }
          mine += " | next: ok";
        } catch (const std::exception& e) {
          mine += " | next: " + describe(e);
        }
      },
      30s);
  slowest = *std::max_element(took.begin(), took.end());
  for (int r = 0; r < world; ++r) {
    if (!errors[r].empty()) outcome[r] += " | escaped: " + errors[r];
  }
  return outcome;
}

}  // namespace

// Ranks that name different roots must not return success with data that
// differs from what their root sent, nor wait for the timeout (30 s here):
// every rank fails with MismatchError, found by itself or relayed, except
// that a rank that only sent (it reads its receivers' confirmations a few
// calls later, see CollectiveStep::expect_confirmation), or whose messages
// all came from ranks that agree with it, may finish its call (its data is
// what the root it named sent) and then fails one of its next
// kConfirmationWindow + 1 calls with the MismatchError.
TEST_CASE("ranks that name different roots fail with MismatchError, promptly",
          "[tcp][mismatch][root]") {
  struct Pattern {
    const char* name;
    std::function<int(int, int)> root;  // (rank, world) -> root
  };
  const std::vector<Pattern> patterns = {
      {"each names itself", [](int r, int) { return r; }},
      {"each names the next rank", [](int r, int n) { return (r + 1) % n; }},
      {"the last rank names 1, the others 0",
       [](int r, int n) { return r == n - 1 ? 1 : 0; }},
      {"half name 0, half the last rank",
       [](int r, int n) { return r < n / 2 ? 0 : n - 1; }},
  };
  // Small messages take the trees; a reduce of 2 MiB at four ranks takes
  // the ring's reduce-scatter and a gather.
  struct Call {
    Rooted kind;
    std::int64_t count;
  };
  const std::vector<Call> calls = {{Rooted::kBroadcast, 4},
                                   {Rooted::kScatter, 4},
                                   {Rooted::kReduce, 4},
                                   {Rooted::kReduce, 1 << 19},
                                   {Rooted::kGather, 4}};
  for (int world : {2, 3, 4}) {
    for (const Call& call : calls) {
      const Rooted kind = call.kind;
      for (const Pattern& pattern : patterns) {
        std::chrono::milliseconds slowest{0};
        auto outcome = rooted_outcome(
            world, kind, call.count,
            [&](int rank) { return pattern.root(rank, world); }, slowest);
        INFO("world " << world << ", " << rooted_name(kind) << " of "
                      << call.count << " floats, " << pattern.name);
        for (int r = 0; r < world; ++r) {
          INFO("rank " << r << " (root " << pattern.root(r, world)
                       << "): " << outcome[r]);
          const bool failed = outcome[r].rfind("MismatchError", 0) == 0;
          const bool finished = outcome[r].rfind("ok |", 0) == 0;
          CHECK((failed || finished));
          // A rank that finished learns of the mismatch at a later call.
          if (finished)
            CHECK_THAT(outcome[r], Catch::Contains("next: Mismatch"));
          CHECK_THAT(outcome[r], !Catch::Contains("escaped"));
        }
        CHECK(slowest < 5s);
      }
    }
  }
}

namespace {

// Runs `before` on both ranks of a group of two, then a broadcast in which
// each rank names the other the root, so that both only receive; checks
// that each fails with MismatchError naming that broadcast, `call`,
// within 5 s.
void check_swapped_roots_fail_promptly(
    const std::function<void(ProcessGroup&)>& before, const char* call) {
  std::vector<std::string> thrown(2);
  std::vector<std::chrono::milliseconds> took(2);
  run_ranks(
      2,
      [&](ProcessGroup& group) {
        const int me = group.rank();
        before(group);
        Tensor t = Tensor::zeros({8}, DType::kF32);
        const auto start = std::chrono::steady_clock::now();
        try {
          group.broadcast(t, {1 - me})->wait();
        } catch (const comm::MismatchError& e) {
          thrown[me] = e.what();
        }
        took[me] = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
      },
      30s);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(thrown[r], Catch::Contains(call));
    CHECK(took[r] < 5s);
  }
}

}  // namespace

// A rank that reads a confirmation it is owed from an earlier call must
// still find, within about 100 ms, that the peer disagrees about the call
// now running: here each rank names the other the root of the second
// broadcast, so both only receive, while rank 0 still waits for rank 1's
// confirmation of the first.
TEST_CASE("a mismatch right after a rooted call fails both ranks promptly",
          "[tcp][mismatch][root]") {
  check_swapped_roots_fail_promptly(
      [](ProcessGroup& group) {
        Tensor t = Tensor::zeros({8}, DType::kF32);
        group.broadcast(t, {0})->wait();
      },
      "broadcast #1");
}

// Confirmations of a gather and a broadcast are still unread when the two
// ranks disagree about the root of the next broadcast, so that each only
// receives: neither may wait for the other's confirmation until the
// timeout.
TEST_CASE("ranks with confirmations unread that then disagree fail promptly",
          "[tcp][mismatch][root]") {
  check_swapped_roots_fail_promptly(
      [](ProcessGroup& group) {
        std::vector<Tensor> gathered;
        if (group.rank() == 0) {
          gathered = {Tensor::zeros({8}, DType::kF32),
                      Tensor::zeros({8}, DType::kF32)};
        }
        group.gather(gathered, Tensor::zeros({8}, DType::kF32), {0})->wait();
        Tensor t = Tensor::zeros({8}, DType::kF32);
        group.broadcast(t, {0})->wait();
      },
      "broadcast #2");
}

// A root's broadcast returns before its receiver has read it, and the
// receiver ran a gather instead, whose message to the root lands where
// the root expects the broadcast's confirmation: neither rank receives
// anything in its call, so the root finds the disagreement only as it
// shuts down, when no call is left to fail. The log is then where the
// user learns of it: an error naming the call. (Reading the root's memory
// instead, the gather meets the broadcast in its call; the root does not.)
TEST_CASE("a mismatch found only at shutdown is logged as an error",
          "[tcp][mismatch][shutdown]") {
  // Errors are logged whatever COMM_LOG_LEVEL the environment sets.
  const comm::LogLevel level = comm::log_level();
  comm::set_log_level(comm::LogLevel::kWarn);
  std::vector<std::string> errors;
  // Rank 1 starts its gather only once rank 0's broadcast has returned: a
  // gather that finds the mismatch first (single copy) reports it, and a
  // report that reached rank 0 during its broadcast would fail that call
  // instead of leaving the mismatch to be found at shutdown.
  std::promise<void> broadcast_returned;
  const std::shared_future<void> returned =
      broadcast_returned.get_future().share();
  const std::string log = comm::testing::capture_stderr([&] {
    errors = run_ranks(
        2,
        [&](ProcessGroup& group) {
          Tensor t = Tensor::zeros({8}, DType::kF32);
          if (group.rank() == 0) {
            group.broadcast(t, {0})->wait();
            broadcast_returned.set_value();
          } else {
            if (returned.wait_for(10s) != std::future_status::ready) {
              throw std::runtime_error(
                  "rank 0's broadcast did not return within 10 s");
            }
            std::vector<Tensor> none;
            group.gather(none, t, {0})->wait();
          }
          group.shutdown();
        },
        10s);
  });
  comm::set_log_level(level);
  CHECK(errors[0].empty());
  // Where the gather reads its root's memory (single copy), it trades
  // addresses with the root first and so meets the broadcast in the call.
  if (!errors[1].empty()) {
    CHECK_THAT(errors[1], Catch::Contains("rank 1 called gather #0") &&
                              Catch::Contains("rank 0 called broadcast #0"));
  }
  CHECK_THAT(log,
             Catch::Contains("[error]") &&
                 Catch::Contains("broadcast #0 (float32 x 8, root 0) "
                                 "failed: rank 0 called broadcast #0") &&
                 Catch::Contains("but rank 1 called gather #0") &&
                 Catch::Contains("found as rank 0 read its confirmations"));
}

TEST_CASE("after a failure the group refuses further collectives",
          "[tcp][mismatch]") {
  auto errors = run_ranks(
      2,
      [&](ProcessGroup& group) {
        Tensor t = Tensor::zeros({group.rank() + 1}, DType::kF32);
        try {
          group.all_reduce(t)->wait();
        } catch (const comm::MismatchError&) {
        }
        Tensor fine = Tensor::zeros({4}, DType::kF32);
        group.all_reduce(fine)->wait();
      },
      10s);
  for (const auto& error : errors) {
    CHECK_THAT(error, Catch::Contains("failed earlier") &&
                          Catch::Contains("all_reduce #0"));
  }
}

TEST_CASE("shutdown fails pending work with an error that says so",
          "[tcp][shutdown]") {
  // Rank 1 stays connected until rank 0 is finished, whatever happens
  // there (bounded, so that a failure cannot hang the test).
  std::promise<void> finished;
  std::shared_future<void> done = finished.get_future().share();
  auto errors = run_ranks(
      2,
      [&](ProcessGroup& group) {
        if (group.rank() == 1) {
          // Stays connected but never joins the barrier.
          done.wait_for(30s);
          return;
        }
        struct Release {
          std::promise<void>& promise;
          ~Release() { promise.set_value(); }
        } release{finished};
        auto waiting = group.barrier();
        Tensor t = Tensor::zeros({4}, DType::kF32);
        auto queued = group.all_reduce(t);
        Tensor in = Tensor::zeros({4}, DType::kF32);
        auto receive = group.irecv(in, 1);
        std::this_thread::sleep_for(100ms);
        const auto start = std::chrono::steady_clock::now();
        group.shutdown();
        for (auto& work : {waiting, queued, receive}) {
          try {
            work->wait(5s);
            throw std::runtime_error("pending work succeeded after shutdown");
          } catch (const comm::BackendError& e) {
            if (std::string(e.what()).find("shut") == std::string::npos) throw;
          }
        }
        if (std::chrono::steady_clock::now() - start > 5s) {
          throw std::runtime_error("shutdown took too long");
        }
        try {
          group.all_reduce(t);
          throw std::runtime_error(
              "a new collective was accepted after shutdown");
        } catch (const comm::BackendError&) {
        }
      },
      60s);
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}
