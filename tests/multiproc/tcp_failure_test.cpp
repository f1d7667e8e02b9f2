// Failures of real rank processes under the TCP backend: a rank killed with
// SIGKILL in the middle of a collective, a rank stopped with SIGSTOP (named
// by the heartbeats, or by the operation's timeout), a rank that computes
// longer than the heartbeat timeout, a rank that arrives after the others
// timed out, a network cut between two network namespaces, and the CPU a
// rank spends blocked in a barrier.
//
// The heartbeat tests set COMM_HEARTBEAT_TIMEOUT to 2 s in their ranks;
// LIVENESS_HEARTBEAT_S (a variable of this test only) sets another value,
// to measure detection times with it (the default, 15, say).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
// A PeerError naming the victim and the knob of the heartbeat timeout.
constexpr int kSilenceNamingVictim = 23;

// The heartbeat timeout of the liveness tests, in seconds.
int heartbeat_s() {
  const char* text = std::getenv("LIVENESS_HEARTBEAT_S");
  return text != nullptr ? std::atoi(text) : 2;
}

// Sets COMM_HEARTBEAT_TIMEOUT in a rank process, before its group exists.
void set_heartbeat(int seconds) {
  if (seconds > 0) {
    setenv("COMM_HEARTBEAT_TIMEOUT", std::to_string(seconds).c_str(), 1);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// A rank that all-reduces 16 MiB in a loop until something fails; it
// writes one byte to `started` after its first all_reduce. `heartbeat_s`
// sets COMM_HEARTBEAT_TIMEOUT (0: the default).
std::unique_ptr<ChildProcess> looping_rank(const std::string& url, int rank,
                                           int world, int victim, int started,
                                           std::chrono::milliseconds op_timeout,
                                           int heartbeat = 0) {
  return std::make_unique<ChildProcess>([=] {
    try {
      set_heartbeat(heartbeat);
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
      if (e.peer_rank() != victim ||
          text.find("rank " + std::to_string(victim)) == std::string::npos) {
        return kOtherError;
      }
      return text.find("COMM_HEARTBEAT_TIMEOUT") != std::string::npos
                 ? kSilenceNamingVictim
                 : kPeerErrorNamingVictim;
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

  LoopingJob(int world, int victim, std::chrono::milliseconds op_timeout,
             int heartbeat = 0) {
    const std::string url = "tcp://127.0.0.1:" +
                            std::to_string(comm::detail::free_loopback_port()) +
                            "?world_size=" + std::to_string(world);
    REQUIRE(pipe(started) == 0);
    for (int rank = 0; rank < world; ++rank) {
      ranks.push_back(looping_rank(url, rank, world, victim, started[1],
                                   op_timeout, heartbeat));
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

TEST_CASE(
    "a stopped rank is named by every other rank within the heartbeat "
    "timeout, far below the operation timeout",
    "[tcp][multiproc][failure][liveness]") {
  const int world = 4;
  const int victim = 2;
  const int heartbeat = heartbeat_s();
  LoopingJob job(world, victim, 300s, heartbeat);
  auto& ranks = job.ranks;
  ranks[victim]->kill(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  double slowest = 0;
  for (int rank = 0; rank < world; ++rank) {
    if (rank == victim) continue;
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(std::chrono::seconds(heartbeat + 30)) ==
          kSilenceNamingVictim);
    slowest = std::max(slowest, seconds_since(stopped));
  }
  std::printf(
      "SIGSTOP of rank %d of %d: every other rank failed %.2f s after it "
      "(COMM_HEARTBEAT_TIMEOUT=%d s, operation timeout 300 s)\n",
      victim, world, slowest, heartbeat);
  // The silence is counted from the victim's last beat, up to a fifth of
  // the timeout before the stop; the margin is for a loaded machine.
  CHECK(slowest < heartbeat + 3.0);
  ranks[victim]->kill(SIGKILL);
}

TEST_CASE(
    "a rank that computes longer than the heartbeat timeout is waited for",
    "[tcp][multiproc][liveness]") {
  const int world = 3;
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port()) +
      "?world_size=" + std::to_string(world);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=] {
      set_heartbeat(2);
      auto group = comm::init_process_group("tcp", url, rank, world, 30s);
      group->barrier()->wait();
      // Rank 1 computes for twice the heartbeat timeout; its control thread
      // keeps beating, so the others wait for it.
      if (rank == 1) std::this_thread::sleep_for(4s);
      comm::Tensor t = comm::Tensor::full({1024}, rank + 1, comm::DType::kF32);
      group->all_reduce(t, {comm::ReduceOp::kSum, 60s})->wait();
      return t.data<float>()[0] == 6.0f ? 0 : 1;
    }));
  }
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(60s) == 0);
  }
}

TEST_CASE("a rank that arrives after another timed out does not succeed",
          "[tcp][multiproc][failure]") {
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port()) +
      "?world_size=2";
  constexpr int kTimedOut = 30;
  constexpr int kFailedToo = 31;
  int done[2];
  REQUIRE(pipe(done) == 0);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=] {
      auto group = comm::init_process_group("tcp", url, rank, 2, 30s);
      group->barrier()->wait();
      comm::Tensor t = comm::Tensor::full({256}, 1.0, comm::DType::kF32);
      // Rank 1 arrives 2 s after rank 0 gave up (1 s); rank 0's data has
      // been waiting in its socket all along.
      if (rank == 1) std::this_thread::sleep_for(3s);
      int code = 0;
      try {
        group->all_reduce(t, {comm::ReduceOp::kSum, 1s})->wait();
        std::fprintf(stderr, "rank %d: all_reduce succeeded\n", rank);
      } catch (const comm::TimeoutError& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        // Rank 0 asked rank 1, which was alive but not there yet.
        const bool says_late =
            std::string(e.what()).find(
                "rank 1 answered that it had not started") != std::string::npos;
        code = rank == 1 ? kFailedToo : says_late ? kTimedOut : kOtherError;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = kOtherError;
      }
      // Rank 0 stays until rank 1 is done, so that rank 1 fails for the
      // report, not for a closed connection.
      if (rank == 0) wait_readable(done[0], 30s);
      if (rank == 1) (void)!write(done[1], "x", 1);
      return code;
    }));
  }
  CHECK(ranks[1]->wait(60s) == kFailedToo);
  CHECK(ranks[0]->wait(60s) == kTimedOut);
  close(done[0]);
  close(done[1]);
}

namespace {

// Two network namespaces joined by a veth pair (10.213.0.1 and .2/24),
// created for one test and removed after it; ok() is false, with the
// reason in why(), where they cannot be made (not root, no `ip`).
class NamespacePair {
 public:
  NamespacePair() {
    const std::string id = std::to_string(getpid());
    names_[0] = "lcomm-hb-" + id + "-a";
    names_[1] = "lcomm-hb-" + id + "-b";
    links_[0] = "lch" + id + "a";
    links_[1] = "lch" + id + "b";
    const std::vector<std::string> steps = {
        "ip netns add " + names_[0],
        "ip netns add " + names_[1],
        "ip link add " + links_[0] + " type veth peer name " + links_[1],
        "ip link set " + links_[0] + " netns " + names_[0],
        "ip link set " + links_[1] + " netns " + names_[1],
        "ip -n " + names_[0] + " addr add " + address(0) + "/24 dev " +
            links_[0],
        "ip -n " + names_[1] + " addr add " + address(1) + "/24 dev " +
            links_[1],
        "ip -n " + names_[0] + " link set " + links_[0] + " up",
        "ip -n " + names_[1] + " link set " + links_[1] + " up",
        "ip -n " + names_[0] + " link set lo up",
        "ip -n " + names_[1] + " link set lo up",
    };
    for (const std::string& step : steps) {
      if (std::system((step + " 2>/dev/null").c_str()) != 0) {
        why_ = "'" + step + "' failed (root and iproute2 are needed)";
        return;
      }
    }
    ok_ = true;
  }
  ~NamespacePair() {
    // Removing a namespace removes its end of the veth pair, and so both.
    for (const std::string& name : names_) {
      (void)!std::system(("ip netns del " + name + " 2>/dev/null").c_str());
    }
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  static std::string address(int side) {
    return side == 0 ? "10.213.0.1" : "10.213.0.2";
  }
  // Moves the calling process (single-threaded) into namespace `side`.
  bool enter(int side) const {
    const int fd =
        open(("/run/netns/" + names_[side]).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool entered = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return entered;
  }
  // Takes side 0's end of the link down: nothing passes between them.
  bool cut() const {
    return std::system(
               ("ip -n " + names_[0] + " link set " + links_[0] + " down")
                   .c_str()) == 0;
  }

 private:
  std::string names_[2];
  std::string links_[2];
  bool ok_ = false;
  std::string why_;
};

}  // namespace

TEST_CASE(
    "a network cut between two namespaces is named on both sides within the "
    "heartbeat timeout",
    "[tcp][multiproc][failure][liveness][netns]") {
  NamespacePair net;
  if (!net.ok()) {
    WARN("SKIPPED: cannot create two network namespaces: " << net.why());
    return;
  }
  const int heartbeat = heartbeat_s();
  // Rank 0's namespace is fresh: any port is free there.
  const std::string url = "tcp://" + NamespacePair::address(0) + ":" +
                          std::to_string(29000 + getpid() % 1000) +
                          "?world_size=2";
  int started[2];
  REQUIRE(pipe(started) == 0);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([&, rank] {
      if (!net.enter(rank)) {
        std::fprintf(stderr, "rank %d: setns failed\n", rank);
        return kOtherError;
      }
      setenv("COMM_TCP_ADDR", NamespacePair::address(rank).c_str(), 1);
      set_heartbeat(heartbeat);
      const int victim = 1 - rank;
      try {
        auto group = comm::init_process_group("tcp", url, rank, 2, 30s);
        comm::Tensor t = comm::Tensor::full({1 << 18}, 1.0, comm::DType::kF32);
        for (int i = 0; i < 1000000; ++i) {
          group->all_reduce(t, {comm::ReduceOp::kMax, 300s})->wait();
          if (i == 0 && rank == 0) (void)!write(started[1], "x", 1);
        }
        return 0;
      } catch (const comm::PeerError& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        const std::string text = e.what();
        return e.peer_rank() == victim &&
                       text.find("COMM_HEARTBEAT_TIMEOUT") != std::string::npos
                   ? kSilenceNamingVictim
                   : kOtherError;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        return kOtherError;
      }
    }));
  }
  REQUIRE(wait_readable(started[0], 60s));
  REQUIRE(net.cut());
  const auto cut = std::chrono::steady_clock::now();
  double slowest = 0;
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(std::chrono::seconds(heartbeat + 30)) ==
          kSilenceNamingVictim);
    slowest = std::max(slowest, seconds_since(cut));
  }
  std::printf(
      "network cut between two namespaces: both ranks failed %.2f s after it "
      "(COMM_HEARTBEAT_TIMEOUT=%d s, operation timeout 300 s)\n",
      slowest, heartbeat);
  CHECK(slowest < heartbeat + 3.0);
  close(started[0]);
  close(started[1]);
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
