// Failures of real rank processes under the TCP backend: a rank killed with
// SIGKILL in the middle of a collective, a rank stopped with SIGSTOP, and
// the CPU a rank spends blocked in a barrier.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "support/child_process.h"

using comm::testing::ChildProcess;
using namespace std::chrono_literals;

namespace {

// Exit codes of a rank that hit a failure, saying what it saw.
constexpr int kPeerErrorNamingVictim = 20;
constexpr int kTimeoutNamingVictim = 21;
constexpr int kOtherError = 22;

// A rank that all-reduces 16 MiB in a loop until something fails; it
// writes one byte to `started` after its first all_reduce.
std::unique_ptr<ChildProcess> looping_rank(
    const std::string& url, int rank, int world, int victim, int started,
    std::chrono::milliseconds op_timeout) {
  return std::make_unique<ChildProcess>([=] {
    try {
      auto group = comm::init_process_group("tcp", url, rank, world, 30s);
      comm::Tensor t = comm::Tensor::full({4 << 20}, 1.0, comm::DType::kF32);
      for (int i = 0; i < 100000; ++i) {
        group->all_reduce(t, {comm::ReduceOp::kMax, op_timeout})->wait();
        if (i == 0 && rank == 0) (void)!write(started, "x", 1);
      }
      return 0;
    } catch (const comm::PeerError& e) {
      const std::string text = e.what();
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return e.peer_rank() == victim &&
                     text.find("rank " + std::to_string(victim)) !=
                         std::string::npos
                 ? kPeerErrorNamingVictim
                 : kOtherError;
    } catch (const comm::TimeoutError& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return std::string(e.what()).find("rank " + std::to_string(victim)) !=
                     std::string::npos
                 ? kTimeoutNamingVictim
                 : kOtherError;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return kOtherError;
    }
  });
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd entry{fd, POLLIN, 0};
  return poll(&entry, 1, static_cast<int>(timeout.count())) == 1;
}

// `world` looping ranks over tcp:// on loopback; the constructor returns
// once rank 0 has finished its first all_reduce.
struct LoopingJob {
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  int started[2] = {-1, -1};

  LoopingJob(int world, int victim, std::chrono::milliseconds op_timeout) {
    const std::string url = "tcp://127.0.0.1:" +
                            std::to_string(comm::detail::free_loopback_port()) +
                            "?world_size=" + std::to_string(world);
    REQUIRE(pipe(started) == 0);
    for (int rank = 0; rank < world; ++rank) {
      ranks.push_back(
          looping_rank(url, rank, world, victim, started[1], op_timeout));
    }
    REQUIRE(wait_readable(started[0], 60s));
  }
  ~LoopingJob() {
    close(started[0]);
    close(started[1]);
  }
};

}  // namespace

TEST_CASE(
    "a rank killed mid-collective fails the others with PeerError naming it",
    "[tcp][multiproc][failure]") {
  const int world = 4;
  const int victim = 2;
  LoopingJob job(world, victim, 60s);
  auto& ranks = job.ranks;
  std::this_thread::sleep_for(50ms);  // well inside a later all_reduce
  ranks[victim]->kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  for (int rank = 0; rank < world; ++rank) {
    if (rank == victim) continue;
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(5s) == kPeerErrorNamingVictim);
  }
  CHECK(std::chrono::steady_clock::now() - killed < 5s + 500ms);
}

TEST_CASE("a stopped rank makes the others time out naming it",
          "[tcp][multiproc][failure]") {
  const int world = 3;
  const int victim = 2;
  LoopingJob job(world, victim, 2s);
  auto& ranks = job.ranks;
  ranks[victim]->kill(SIGSTOP);
  for (int rank = 0; rank < world; ++rank) {
    if (rank == victim) continue;
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(15s) == kTimeoutNamingVictim);
  }
  ranks[victim]->kill(SIGKILL);
}

TEST_CASE("a rank blocked in a barrier uses almost no CPU",
          "[tcp][multiproc]") {
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port()) +
      "?world_size=2";
  ChildProcess sleeper([&] {
    auto group = comm::init_process_group("tcp", url, 1, 2, 30s);
    group->barrier()->wait();  // both ready
    std::this_thread::sleep_for(2s);
    group->barrier()->wait();
    return 0;
  });
  ChildProcess waiter([&] {
    auto group = comm::init_process_group("tcp", url, 0, 2, 30s);
    group->barrier()->wait();
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    const auto start = std::chrono::steady_clock::now();
    group->barrier()->wait();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    getrusage(RUSAGE_SELF, &after);
    auto seconds = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6;
    };
    const double cpu = seconds(after.ru_utime) - seconds(before.ru_utime) +
                       seconds(after.ru_stime) - seconds(before.ru_stime);
    std::printf("barrier: waited %.3f s, used %.4f s of CPU (%.2f%%)\n", wall,
                cpu, 100 * cpu / wall);
    return wall > 1.5 && cpu < 0.05 * wall ? 0 : 1;
  });
  CHECK(waiter.wait(30s) == 0);
  CHECK(sleeper.wait(30s) == 0);
}
