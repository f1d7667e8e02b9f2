// Ranks that call different collectives, or the same one with different
// arguments, fail with MismatchError naming both calls instead of
// corrupting data or hanging; and shutdown fails pending work promptly.
#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "support/thread_ranks.h"

using comm::DType;
using comm::ProcessGroup;
using comm::ReduceOp;
using comm::Tensor;
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

TEST_CASE(
    "a rank that finished its part learns of the mismatch at its next call",
    "[tcp][mismatch]") {
  std::vector<std::string> thrown(2);
  run_ranks(
      2,
      [&](ProcessGroup& group) {
        Tensor t = Tensor::zeros({8}, DType::kF32);
        try {
          // Rank 0's broadcast only sends, so it completes; rank 1 expected a
          // barrier and reports the mismatch to rank 0.
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
  // Rank 0 fails at its next call: either its own receive sees rank 1's
  // barrier #0, or rank 1's report arrives first; a mismatch either way.
  CHECK_THAT(thrown[0], Catch::Contains("barrier #0"));
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
