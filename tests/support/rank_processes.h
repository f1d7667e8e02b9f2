// Jobs of real rank processes for the failure tests (tests/multiproc): the
// exit codes in which a rank says what failure it saw, a rendezvous URL on
// loopback, a one-byte signal between the processes, the start and the
// checked end of a job's ranks, and the all_reduce loop they fail in. The ranks
// are forked ChildProcesses, so the rules of child_process.h apply: fork only
// from a single-threaded process.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "support/child_process.h"

namespace comm::testing {

// Exit codes of a rank that hit a failure, saying what it saw (see
// failure_exit_code). A test's own outcomes take codes from
// kFirstTestExitCode up, below ChildProcess's 99 for an escaped exception.
inline constexpr int kPeerErrorNamingVictim = 20;
inline constexpr int kTimeoutNamingVictim = 21;
inline constexpr int kOtherError = 22;
// A PeerError naming the victim and the knob of the heartbeat timeout.
inline constexpr int kSilenceNamingVictim = 23;
inline constexpr int kFirstTestExitCode = 30;

// The exit code of rank `rank` for `failure`, which it caught while rank
// `victim` was made to fail: kPeerErrorNamingVictim for a PeerError that
// blames the victim and names it in its text (kSilenceNamingVictim when the
// text names COMM_HEARTBEAT_TIMEOUT too), kTimeoutNamingVictim for a
// TimeoutError whose text names the victim, kOtherError for anything else.
// The error's text goes to stderr, with the rank.
inline int failure_exit_code(const std::exception_ptr& failure, int rank,
                             int victim) {
  const std::string victim_name = "rank " + std::to_string(victim);
  auto names = [](const std::exception& e, const std::string& what) {
    return std::string(e.what()).find(what) != std::string::npos;
  };
  try {
    std::rethrow_exception(failure);
  } catch (const PeerError& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    if (e.peer_rank() != victim || !names(e, victim_name)) return kOtherError;
    return names(e, "COMM_HEARTBEAT_TIMEOUT") ? kSilenceNamingVictim
                                              : kPeerErrorNamingVictim;
  } catch (const TimeoutError& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return names(e, victim_name) ? kTimeoutNamingVictim : kOtherError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
  } catch (...) {
    std::fprintf(stderr, "rank %d: an exception of an unknown type\n", rank);
  }
  return kOtherError;
}

// A tcp:// URL for a job of `world` ranks whose rank 0 hosts the store on a
// free loopback port.
inline std::string loopback_url(int world) {
  return "tcp://127.0.0.1:" + std::to_string(detail::free_loopback_port()) +
         "?world_size=" + std::to_string(world);
}

// A one-byte signal over a pipe made before the ranks are forked: any
// process raises it (a rank that reached a point), any other waits for it
// (the test process). Capture it by reference in a rank's body.
class PipeSignal {
 public:
  PipeSignal() {
    if (pipe(fds_) != 0) throw std::runtime_error("PipeSignal: pipe failed");
  }
  ~PipeSignal() {
    close(fds_[0]);
    close(fds_[1]);
  }
  PipeSignal(const PipeSignal&) = delete;
  PipeSignal& operator=(const PipeSignal&) = delete;

  void raise() const { (void)!write(fds_[1], "x", 1); }
  // Whether the signal was raised within `timeout`.
  bool wait(std::chrono::milliseconds timeout) const {
    pollfd entry{fds_[0], POLLIN, 0};
    return poll(&entry, 1, static_cast<int>(timeout.count())) == 1;
  }

 private:
  int fds_[2] = {-1, -1};
};

// All-reduces (max) `elements` floats on `group` `rounds` times, each call
// with `op_timeout`, for a test to kill, stop or cut off a rank meanwhile;
// rank 0 raises `started` after its first all_reduce. The tensor is in
// shared host memory where `shared`. Throws what failed.
inline void all_reduce_rounds(ProcessGroup& group, std::int64_t elements,
                              int rounds, std::chrono::milliseconds op_timeout,
                              const PipeSignal& started, bool shared = false) {
  Tensor t = Tensor::full({elements}, 1.0, DType::kF32);
  if (shared) {
    Tensor ones = t;
    t = Tensor::shared_host_zeros({elements}, DType::kF32);
    t.copy_(ones);
  }
  for (int i = 0; i < rounds; ++i) {
    group.all_reduce(t, {ReduceOp::kMax, op_timeout})->wait();
    if (i == 0 && group.rank() == 0) started.raise();
  }
}

using RankProcesses = std::vector<std::unique_ptr<ChildProcess>>;

// Forks the `world` ranks of a job; rank r runs body(r), whose return value
// is its exit code.
inline RankProcesses start_ranks(int world,
                                 const std::function<int(int rank)>& body) {
  RankProcesses ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(
        std::make_unique<ChildProcess>([&body, rank] { return body(rank); }));
  }
  return ranks;
}

// Waits for every rank but `victim` (-1: every rank) to end, up to `timeout`
// each, and checks that each exited with `expected`. Returns the seconds
// from `since` to the end of the last of them.
inline double check_exit_codes(RankProcesses& ranks, int victim, int expected,
                               std::chrono::milliseconds timeout,
                               std::chrono::steady_clock::time_point since =
                                   std::chrono::steady_clock::now()) {
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    if (static_cast<int>(rank) == victim) continue;
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(timeout) == expected);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace comm::testing
