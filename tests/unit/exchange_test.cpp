// comm::tcp::Exchange: one step of a collective, a set of sends and
// receives that progress together. Ranks run as threads, each with its own
// Mesh over one HashStore, and use only Exchange's public calls. Catch2's
// assertions are not thread-safe, so the ranks' threads throw what they find
// and the test's thread checks it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "libcomm/error.h"
#include "support/env_is.h"
#include "support/mesh_ranks.h"
#include "support/rank_checks.h"

using comm::DType;
using comm::ReduceOp;
using comm::detail::Clock;
using comm::tcp::CallInfo;
using comm::tcp::Collective;
using comm::tcp::Exchange;
using comm::tcp::Mesh;
using comm::testing::check_all_ok;
using comm::testing::EnvIs;
using comm::testing::expect;
using comm::testing::run_meshes;
using namespace std::chrono_literals;

namespace {

CallInfo call_of(std::int64_t count, DType dtype = DType::kF32) {
  return {Collective::kAllReduce, 0, dtype, count, ReduceOp::kSum, -1};
}

// A payload larger than the sockets' buffers and than one reduction chunk
// (chunk_bytes()), so that transfers cross many poll rounds and chunks.
constexpr std::size_t kLarge = (3 << 20) + 12;

// Bytes that say which rank made them and where they sit.
std::vector<std::uint8_t> pattern(int rank, std::size_t bytes) {
  std::vector<std::uint8_t> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<std::uint8_t>(i * 31 + static_cast<std::size_t>(rank));
  }
  return out;
}

std::vector<float> floats(int rank, std::size_t count) {
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
  }
  return out;
}

Clock::time_point soon() { return comm::detail::deadline_after(30s); }

// Tells a waiting rank that this one is done with its step, however the
// step ended, so that the waiting rank cannot hang the test.
struct Done {
  std::promise<void>& promise;
  ~Done() { promise.set_value(); }
};

}  // namespace

TEST_CASE("send and recv move a message each way between two ranks",
          "[tcp][exchange]") {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, kLarge}) {
    INFO(bytes << " bytes");
    auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
      const int peer = 1 - mesh.rank();
      const auto mine = pattern(mesh.rank(), bytes);
      std::vector<std::uint8_t> theirs(bytes, 0);
      Exchange step(mesh, call_of(static_cast<std::int64_t>(bytes)), soon(),
                    -1);
      step.send(peer, mine.data(), bytes);
      step.recv(peer, theirs.data(), bytes);
      step.run();
      expect(theirs == pattern(peer, bytes), "received bytes differ");
    });
    check_all_ok(errors);
  }
}

TEST_CASE("recv_reduce combines what arrives into the destination",
          "[tcp][exchange]") {
  const std::size_t count = kLarge / sizeof(float);
  const std::size_t bytes = count * sizeof(float);
  SECTION("in place") {
    auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
      const int peer = 1 - mesh.rank();
      const auto mine = floats(mesh.rank(), count);
      auto data = mine;
      Exchange step(mesh, call_of(static_cast<std::int64_t>(count)), soon(),
                    -1);
      step.send(peer, mine.data(), bytes);
      step.recv_reduce(peer, data.data(), bytes, DType::kF32, ReduceOp::kMax);
      step.run();
      const auto theirs = floats(peer, count);
      for (std::size_t i = 0; i < count; ++i) {
        expect(data[i] == std::max(mine[i], theirs[i]),
               "element " + std::to_string(i));
      }
    });
    check_all_ok(errors);
  }
  SECTION("out of place, from a base that stays untouched") {
    auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
      const int peer = 1 - mesh.rank();
      const auto mine = floats(mesh.rank(), count);
      const auto base = mine;
      std::vector<float> out(count, -1.0f);
      Exchange step(mesh, call_of(static_cast<std::int64_t>(count)), soon(),
                    -1);
      step.send(peer, mine.data(), bytes);
      step.recv_reduce(peer, out.data(), bytes, DType::kF32, ReduceOp::kSum,
                       base.data());
      step.run();
      const auto theirs = floats(peer, count);
      expect(base == mine, "the base was written");
      for (std::size_t i = 0; i < count; ++i) {
        expect(out[i] == mine[i] + theirs[i], "element " + std::to_string(i));
      }
    });
    check_all_ok(errors);
  }
}

TEST_CASE("a one-way message larger than the ring arrives whole",
          "[tcp][exchange]") {
  // One way, a writer over a ring publishes as it copies (where the ranks
  // have a CPU each), and the reader stores or reduces what it finds.
  const std::size_t count = kLarge / sizeof(float);
  const std::size_t bytes = count * sizeof(float);
  for (const bool reduce : {false, true}) {
    INFO((reduce ? "recv_reduce" : "recv"));
    auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
      const auto mine = floats(mesh.rank(), count);
      auto data = mine;
      Exchange step(mesh, call_of(static_cast<std::int64_t>(count)), soon(),
                    -1);
      if (mesh.rank() == 0) {
        step.send(1, mine.data(), bytes);
      } else if (reduce) {
        step.recv_reduce(0, data.data(), bytes, DType::kF32, ReduceOp::kSum);
      } else {
        step.recv(0, data.data(), bytes);
      }
      step.run();
      if (mesh.rank() == 0) return;
      const auto theirs = floats(0, count);
      for (std::size_t i = 0; i < count; ++i) {
        const float expected = reduce ? mine[i] + theirs[i] : theirs[i];
        expect(data[i] == expected, "element " + std::to_string(i));
      }
    });
    check_all_ok(errors);
  }
}

TEST_CASE(
    "recv_reduce of a payload that lies misaligned in the ring, after a "
    "message of odd length, and larger than the ring",
    "[tcp][exchange]") {
  // Three bytes, then a header, leave the f64 payload at an odd offset, so
  // that it cannot be reduced where it lies; 100003 elements wrap the ring
  // several times.
  const std::size_t count = 100003;
  const std::size_t bytes = count * sizeof(double);
  auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
    const int peer = 1 - mesh.rank();
    const auto odd = pattern(mesh.rank(), 3);
    std::vector<std::uint8_t> odd_in(3);
    {
      Exchange step(mesh, call_of(3, DType::kU8), soon(), -1);
      step.send(peer, odd.data(), odd.size());
      step.recv(peer, odd_in.data(), odd_in.size());
      step.run();
    }
    expect(odd_in == pattern(peer, 3), "the odd message differs");
    auto values = [](int rank, std::size_t n) {
      std::vector<double> out(n);
      for (std::size_t i = 0; i < n; ++i) out[i] = rank * 0.5 + double(i % 101);
      return out;
    };
    const auto mine = values(mesh.rank(), count);
    auto data = mine;
    Exchange step(mesh, call_of(static_cast<std::int64_t>(count), DType::kF64),
                  soon(), -1);
    step.send(peer, mine.data(), bytes);
    step.recv_reduce(peer, data.data(), bytes, DType::kF64, ReduceOp::kSum);
    step.run();
    const auto theirs = values(peer, count);
    for (std::size_t i = 0; i < count; ++i) {
      expect(data[i] == mine[i] + theirs[i], "element " + std::to_string(i));
    }
  });
  check_all_ok(errors);
}

TEST_CASE(
    "messages of many calls waiting in a socket are read in order, in "
    "whole and in pieces, whatever their sizes",
    "[tcp][exchange]") {
  // Over TCP a receive takes whatever else has arrived from the peer into
  // the Mesh's read-ahead buffer, and the next receives start there. Rank 1
  // starts reading only after rank 0 has sent what the socket holds, so its
  // reads find several calls' messages at once, messages split across the
  // buffer's end, and messages larger than the buffer.
  EnvIs tcp({{"COMM_TRANSPORT", "tcp"}});
  const std::vector<std::size_t> sizes = {1,
                                          0,
                                          100,
                                          3,
                                          Mesh::kReadAheadBytes - 64,
                                          Mesh::kReadAheadBytes,
                                          Mesh::kReadAheadBytes + 13,
                                          7,
                                          40000,
                                          1000};
  constexpr int kCalls = 60;
  auto size_of = [&](int call) {
    return sizes[static_cast<std::size_t>(call) % sizes.size()];
  };
  auto call_for = [&](int call) {
    CallInfo info =
        call_of(static_cast<std::int64_t>(size_of(call)), DType::kU8);
    info.sequence = static_cast<std::uint64_t>(call);
    return info;
  };
  auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
    expect(mesh.ring(1 - mesh.rank(), comm::tcp::Channel::kCollective, false) ==
               nullptr,
           "COMM_TRANSPORT=tcp and yet a ring");
    if (mesh.rank() == 0) {
      for (int call = 0; call < kCalls; ++call) {
        const auto mine = pattern(call, size_of(call));
        Exchange step(mesh, call_for(call), soon(), -1);
        step.send(1, mine.data(), mine.size());
        step.run();
      }
      return;
    }
    std::this_thread::sleep_for(200ms);
    for (int call = 0; call < kCalls; ++call) {
      std::vector<std::uint8_t> theirs(size_of(call), 0xee);
      Exchange step(mesh, call_for(call), soon(), -1);
      step.recv(0, theirs.data(), theirs.size());
      step.run();
      expect(theirs == pattern(call, size_of(call)),
             "call " + std::to_string(call) + ": received bytes differ");
    }
  });
  check_all_ok(errors);
}

TEST_CASE("recv_parts fills parts in order and relay forwards them",
          "[tcp][exchange]") {
  // Rank 0 sends to rank 1, which forwards what it receives to rank 2
  // behind a prefix of its own that can go at once: rank 2 receives the
  // prefix followed by rank 0's bytes, in one message.
  const std::size_t prefix = 1000;
  const std::size_t bytes = kLarge;
  auto errors = run_meshes(3, 30s, [&](Mesh& mesh) {
    Exchange step(mesh, call_of(static_cast<std::int64_t>(bytes)), soon(), -1);
    if (mesh.rank() == 0) {
      const auto mine = pattern(0, bytes);
      step.send(1, mine.data(), bytes);
      step.run();
    } else if (mesh.rank() == 1) {
      auto own = pattern(1, prefix);
      // Received in two parts, to show that parts fill in order.
      std::vector<std::uint8_t> received(bytes);
      const std::size_t half = bytes / 2;
      const comm::CollectiveStep::Part halves[] = {
          {received.data(), half}, {received.data() + half, bytes - half}};
      const int source = step.recv_parts(0, halves, DType::kU8, ReduceOp::kSum);
      const comm::CollectiveStep::Part forwarded[] = {{own.data(), prefix},
                                                      {received.data(), bytes}};
      step.relay(2, forwarded, prefix, source);
      step.run();
      expect(received == pattern(0, bytes), "rank 1 received other bytes");
    } else {
      std::vector<std::uint8_t> all(prefix + bytes);
      step.recv(1, all.data(), all.size());
      step.run();
      auto expected = pattern(1, prefix);
      const auto from0 = pattern(0, bytes);
      expected.insert(expected.end(), from0.begin(), from0.end());
      expect(all == expected, "rank 2 received other bytes");
    }
  });
  check_all_ok(errors);
}

TEST_CASE("a peer's message of another call is a MismatchError naming both",
          "[tcp][exchange]") {
  SECTION("different calls") {
    auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
      const int peer = 1 - mesh.rank();
      const std::int64_t count = mesh.rank() == 0 ? 10 : 20;
      float buffer[20] = {};
      Exchange step(mesh, call_of(count), soon(), -1);
      step.send(peer, buffer, 4);
      step.recv(peer, buffer, 4);
      try {
        step.run();
      } catch (const comm::MismatchError& e) {
        throw std::runtime_error(std::string("MismatchError: ") + e.what());
      }
    });
    for (const auto& error : errors) {
      CHECK_THAT(error,
                 Catch::StartsWith("MismatchError") &&
                     Catch::Contains("all_reduce #0 (float32 x 10, sum)") &&
                     Catch::Contains("all_reduce #0 (float32 x 20, sum)"));
    }
  }
  SECTION("one call, different payload sizes") {
    auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
      const int peer = 1 - mesh.rank();
      const std::size_t bytes = mesh.rank() == 0 ? 8 : 16;
      std::uint8_t buffer[16] = {};
      Exchange step(mesh, call_of(4), soon(), -1);
      step.send(peer, buffer, bytes);
      step.recv(peer, buffer, bytes);
      try {
        step.run();
      } catch (const comm::MismatchError& e) {
        throw std::runtime_error(std::string("MismatchError: ") + e.what());
      }
    });
    CHECK_THAT(errors[0], Catch::StartsWith("MismatchError") &&
                              Catch::Contains("rank 1 sends 16 bytes where "
                                              "rank 0 expects 8"));
    CHECK_THAT(errors[1], Catch::StartsWith("MismatchError") &&
                              Catch::Contains("rank 0 sends 8 bytes where "
                                              "rank 1 expects 16"));
  }
}

TEST_CASE("a peer that never sends is named in a TimeoutError at the deadline",
          "[tcp][exchange]") {
  std::promise<void> finished;
  auto rank0_done = finished.get_future().share();
  const auto budget = 300ms;
  std::chrono::milliseconds waited{0};
  auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
    if (mesh.rank() == 1) {
      // Rank 1 stays connected and silent until rank 0 has given up.
      rank0_done.wait_for(30s);
      return;
    }
    Done done{finished};
    std::uint8_t buffer[4] = {};
    const auto start = Clock::now();
    Exchange step(mesh, call_of(1), comm::detail::deadline_after(budget), -1);
    step.recv(1, buffer, sizeof(buffer));
    try {
      step.run();
    } catch (const comm::TimeoutError& e) {
      waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          Clock::now() - start);
      throw std::runtime_error(std::string("TimeoutError: ") + e.what());
    }
  });
  CHECK_THAT(errors[0], Catch::StartsWith("TimeoutError") &&
                            Catch::Contains("all_reduce #0") &&
                            Catch::Contains("rank 1 did not send or receive"));
  CHECK(errors[1] == "");
  CHECK(waited >= budget);
  CHECK(waited < budget + 5s);
}

TEST_CASE("a peer that closes its connections is a PeerError naming it",
          "[tcp][exchange]") {
  auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
    // Rank 1 leaves at once, closing its sockets.
    if (mesh.rank() == 1) return;
    std::uint8_t buffer[4] = {};
    Exchange step(mesh, call_of(1), soon(), -1);
    step.recv(1, buffer, sizeof(buffer));
    try {
      step.run();
    } catch (const comm::PeerError& e) {
      expect(e.peer_rank() == 1,
             "PeerError names rank " + std::to_string(e.peer_rank()));
      throw std::runtime_error(std::string("PeerError: ") + e.what());
    }
  });
  CHECK_THAT(errors[0],
             Catch::StartsWith("PeerError") && Catch::Contains("rank 1"));
  CHECK(errors[1] == "");
}

TEST_CASE("the wake-up descriptor interrupts a waiting step",
          "[tcp][exchange]") {
  int wake[2];
  REQUIRE(::pipe2(wake, O_CLOEXEC) == 0);
  std::promise<void> finished;
  auto rank0_done = finished.get_future().share();
  auto errors = run_meshes(2, 30s, [&](Mesh& mesh) {
    if (mesh.rank() == 1) {
      // Rank 1 sends nothing; it wakes rank 0 instead, then stays connected
      // until rank 0 has returned.
      std::this_thread::sleep_for(50ms);
      const char byte = 1;
      expect(::write(wake[1], &byte, 1) == 1, "write to the wake pipe");
      rank0_done.wait_for(30s);
      return;
    }
    Done done{finished};
    std::uint8_t buffer[4] = {};
    Exchange step(mesh, call_of(1), soon(), wake[0]);
    step.recv(1, buffer, sizeof(buffer));
    try {
      step.run();
    } catch (const comm::BackendError& e) {
      throw std::runtime_error(std::string("BackendError: ") + e.what());
    }
  });
  ::close(wake[0]);
  ::close(wake[1]);
  CHECK_THAT(errors[0], Catch::StartsWith("BackendError") &&
                            Catch::Contains("shutting down"));
  CHECK(errors[1] == "");
}
