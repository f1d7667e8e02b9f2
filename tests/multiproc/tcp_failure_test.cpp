// Failures of real rank processes under the TCP backend: a rank killed with
// SIGKILL in the middle of a collective, a rank stopped with SIGSTOP (named
// by the heartbeats, or by the operation's timeout), a rank that computes
// longer than the heartbeat timeout, a rank that arrives after the others
// timed out, a network cut between two network namespaces, a rank killed
// during the group's set-up, a rank lost to another's point-to-point
// operation, the CPU a rank spends blocked in a barrier, and open-file
// limits too low for a group.
//
// The heartbeat tests set COMM_HEARTBEAT_TIMEOUT to 2 s in their ranks;
// LIVENESS_HEARTBEAT_S (a variable of this test only) sets another value,
// to measure detection times with it (the default, 15, say).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "support/child_process.h"
#include "support/namespace_pair.h"
#include "support/rank_processes.h"
#include "support/rank_stores.h"
#include "support/temp_path.h"

using comm::testing::ChildProcess;
using comm::testing::kFirstTestExitCode;
using comm::testing::kOtherError;
using comm::testing::kPeerErrorNamingVictim;
using comm::testing::kSilenceNamingVictim;
using comm::testing::kTimeoutNamingVictim;
using comm::testing::NamespacePair;
using comm::testing::PipeSignal;
using comm::testing::RankProcesses;
using namespace std::chrono_literals;

namespace {

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

// `world` ranks over tcp:// on loopback that all-reduce 16 MiB in a loop
// until something fails, each exiting with failure_exit_code for `victim`;
// `heartbeat` sets COMM_HEARTBEAT_TIMEOUT (0: the default). The constructor
// returns once rank 0 has finished its first all_reduce.
struct LoopingJob {
  PipeSignal started;
  RankProcesses ranks;

  LoopingJob(int world, int victim, std::chrono::milliseconds op_timeout,
             int heartbeat = 0) {
    const std::string url = comm::testing::loopback_url(world);
    ranks = comm::testing::start_ranks(world, [&](int rank) {
      try {
        set_heartbeat(heartbeat);
        auto group = comm::init_process_group("tcp", url, rank, world, 30s);
        comm::testing::all_reduce_rounds(*group, 4 << 20, 100000, op_timeout,
                                         started);
        return 0;
      } catch (...) {
        return comm::testing::failure_exit_code(std::current_exception(), rank,
                                                victim);
      }
    });
    REQUIRE(started.wait(60s));
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
  CHECK(comm::testing::check_exit_codes(ranks, victim, kPeerErrorNamingVictim,
                                        5s) < 5.5);
}

TEST_CASE("a stopped rank makes the others time out naming it",
          "[tcp][multiproc][failure]") {
  const int world = 3;
  const int victim = 2;
  LoopingJob job(world, victim, 2s);
  auto& ranks = job.ranks;
  ranks[victim]->kill(SIGSTOP);
  comm::testing::check_exit_codes(ranks, victim, kTimeoutNamingVictim, 15s);
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
  const double slowest =
      comm::testing::check_exit_codes(ranks, victim, kSilenceNamingVictim,
                                      std::chrono::seconds(heartbeat + 30));
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
  const std::string url = comm::testing::loopback_url(world);
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    set_heartbeat(2);
    auto group = comm::init_process_group("tcp", url, rank, world, 30s);
    group->barrier()->wait();
    // Rank 1 computes for twice the heartbeat timeout; its control thread
    // keeps beating, so the others wait for it.
    if (rank == 1) std::this_thread::sleep_for(4s);
    comm::Tensor t = comm::Tensor::full({1024}, rank + 1, comm::DType::kF32);
    group->all_reduce(t, {comm::ReduceOp::kSum, 60s})->wait();
    return t.data<float>()[0] == 6.0f ? 0 : 1;
  });
  comm::testing::check_exit_codes(ranks, -1, 0, 60s);
}

TEST_CASE("a rank that arrives after another timed out does not succeed",
          "[tcp][multiproc][failure]") {
  const std::string url = comm::testing::loopback_url(2);
  constexpr int kTimedOut = kFirstTestExitCode;
  constexpr int kFailedToo = kFirstTestExitCode + 1;
  PipeSignal done;
  auto ranks = comm::testing::start_ranks(2, [&](int rank) {
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
    if (rank == 0) done.wait(30s);
    if (rank == 1) done.raise();
    return code;
  });
  CHECK(ranks[1]->wait(60s) == kFailedToo);
  CHECK(ranks[0]->wait(60s) == kTimedOut);
}

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
  PipeSignal started;
  auto ranks = comm::testing::start_ranks(2, [&](int rank) {
    if (!net.enter(rank)) {
      std::fprintf(stderr, "rank %d: setns failed\n", rank);
      return kOtherError;
    }
    setenv("COMM_TCP_ADDR", NamespacePair::address(rank).c_str(), 1);
    set_heartbeat(heartbeat);
    const int victim = 1 - rank;
    try {
      auto group = comm::init_process_group("tcp", url, rank, 2, 30s);
      comm::testing::all_reduce_rounds(*group, 1 << 18, 1000000, 300s, started);
      return 0;
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              victim);
    }
  });
  REQUIRE(started.wait(60s));
  REQUIRE(net.cut());
  const double slowest = comm::testing::check_exit_codes(
      ranks, -1, kSilenceNamingVictim, std::chrono::seconds(heartbeat + 30));
  std::printf(
      "network cut between two namespaces: both ranks failed %.2f s after it "
      "(COMM_HEARTBEAT_TIMEOUT=%d s, operation timeout 300 s)\n",
      slowest, heartbeat);
  CHECK(slowest < heartbeat + 3.0);
}

TEST_CASE(
    "a rank killed at any point of the TCP set-up is a PeerError naming it "
    "within 5 s",
    "[tcp][multiproc][failure]") {
  // Over TCP alone, as between hosts, with no pidfd to watch: rank 2 of 4
  // dies right after it publishes its address (rank 3 then finds its
  // listener closed while ranks 0 and 1 wait for its connections), or
  // its arrival at the set-up's last barrier (its connections hang up).
  // Rank 3, the highest, to which no rank connects, dies right after it
  // publishes its address: rank 0 finds its listener closed by probing it.
  // Each rank keeps its store until its process ends, as a program does.
  const auto row = GENERATE(table<int, const char*>(
      {{2, "tcp/addr/2"}, {2, "tcp/connected/rank/2"}, {3, "tcp/addr/3"}}));
  const int victim = std::get<0>(row);
  const char* fatal_key = std::get<1>(row);
  INFO("rank " << victim << " dies after setting " << fatal_key);
  const int world = 4;
  const std::uint16_t port = comm::detail::free_loopback_port();
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", "tcp", 1);
    try {
      auto store = comm::testing::kept_rank_store(rank, port);
      if (rank == victim) {
        store = std::make_shared<comm::testing::DyingStore>(*store, fatal_key);
      }
      comm::ProcessGroup group(store, rank, world, "tcp", 60s);
      return kOtherError;  // a group without the victim
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              victim);
    }
  });
  REQUIRE(ranks[victim]->wait(60s) == 128 + SIGKILL);
  const auto died = std::chrono::steady_clock::now();
  const double slowest = comm::testing::check_exit_codes(
      ranks, victim, kPeerErrorNamingVictim, 60s, died);
  std::printf(
      "rank %d killed after setting %s: every other rank failed %.2f s after "
      "it (set-up deadline 60 s)\n",
      victim, fatal_key, slowest);
  CHECK(slowest < 5.5);
}

TEST_CASE(
    "a rank that times out in the set-up is not taken for dead by the others",
    "[tcp][multiproc][failure]") {
  // Rank 2 of 3 reaches the set-up's last barrier 4 s late; rank 0, whose
  // set-up timeout is 2 s, gives up first and exits. Rank 1 must hear rank
  // 0's reason (rank 2 missing), not take rank 0 for dead as it exits. Over
  // TCP the others see rank 0's sockets hang up; with shared memory (every
  // rank on this host) they see its process exit, through its pidfd.
  const std::string transport = GENERATE("tcp", "auto");
  CAPTURE(transport);
  constexpr int kTakenForDead = kFirstTestExitCode;
  const int world = 3, late = 2;
  const std::uint16_t port = comm::detail::free_loopback_port();
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", transport.c_str(), 1);
    try {
      auto store = comm::testing::kept_rank_store(rank, port);
      if (rank == late) {
        store = std::make_shared<comm::testing::SlowStore>(
            *store, "tcp/connected/rank/2", 4s);
      }
      comm::ProcessGroup group(store, rank, world, "tcp", rank == 0 ? 2s : 20s);
      return kOtherError;  // a group though rank 0 gave up
    } catch (const comm::PeerError& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      if (e.peer_rank() == 0) return kTakenForDead;
      return std::string(e.what()).find("missing rank 2") != std::string::npos
                 ? 0
                 : kOtherError;
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              late);
    }
  });
  CHECK(ranks[0]->wait(60s) == kTimeoutNamingVictim);
  CHECK(ranks[1]->wait(60s) == 0);
  ranks[2]->wait(60s);  // fails as it can, the group gone
}

TEST_CASE(
    "a rank that loses its point-to-point peer tells the others: they name "
    "that peer",
    "[tcp][multiproc][failure][p2p]") {
  // Rank 2 of 3 dies while rank 1 waits to receive from it. Then one rank
  // waits where it cannot see the death itself, and must fail within
  // seconds naming rank 2, not wait out its timeout nor blame a rank that
  // left because of the death:
  // - rank 0 in a broadcast from rank 1, which stays but never joins it;
  // - rank 0 receiving from rank 1, which exits on its error;
  // - rank 1 itself, in a broadcast from rank 0, which never joins it.
  const std::string transport = GENERATE("tcp", "auto");
  const std::string waits = GENERATE("rank 0 in a broadcast from rank 1",
                                     "rank 0 receiving from rank 1",
                                     "rank 1 in a broadcast from rank 0");
  CAPTURE(transport, waits);
  const int world = 3, victim = 2;
  const int waiting = waits.starts_with("rank 0") ? 0 : 1;
  const std::string url = comm::testing::loopback_url(world);
  PipeSignal ready;
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", transport.c_str(), 1);
    try {
      auto group = comm::init_process_group("tcp", url, rank, world, 30s);
      group->barrier()->wait();
      comm::Tensor t = comm::Tensor::zeros({1024}, comm::DType::kF32);
      if (rank == victim) {
        std::this_thread::sleep_for(300ms);  // rank 1's receive is posted
        ready.raise();
        raise(SIGKILL);
      }
      if (rank == 1) {
        int seen = kOtherError;
        try {
          group->recv(t, victim);
        } catch (...) {
          seen = comm::testing::failure_exit_code(std::current_exception(),
                                                  rank, victim);
        }
        if (waits == "rank 0 receiving from rank 1") return seen;
        if (waits == "rank 0 in a broadcast from rank 1") {
          std::this_thread::sleep_for(8s);
          return seen;
        }
        if (seen != kPeerErrorNamingVictim) return seen;
        group->broadcast(t, {.root = 0, .timeout = 20s})->wait();
        return kOtherError;  // served though rank 0 never sent
      }
      if (waits == "rank 0 in a broadcast from rank 1") {
        group->broadcast(t, {.root = 1, .timeout = 20s})->wait();
      } else if (waits == "rank 0 receiving from rank 1") {
        group->recv(t, 1, {.timeout = 20s});
      } else {
        std::this_thread::sleep_for(8s);
        return kPeerErrorNamingVictim;  // nothing to fail
      }
      return kOtherError;  // served though rank 1 never sent
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              victim);
    }
  });
  REQUIRE(ready.wait(60s));
  const auto died = std::chrono::steady_clock::now();
  CHECK(ranks[waiting]->wait(30s) == kPeerErrorNamingVictim);
  const double failed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - died)
          .count();
  std::printf(
      "rank 2 killed while rank 1 received from it (%s): %s failed %.2f s "
      "after it (operation timeout 20 s)\n",
      transport.c_str(), waits.c_str(), failed);
  CHECK(failed < 5.0);
  CHECK(ranks[1 - waiting]->wait(30s) == kPeerErrorNamingVictim);
  CHECK(ranks[victim]->wait(30s) == 128 + SIGKILL);
}

TEST_CASE(
    "a rank that shuts its group down early is named as leaving, and one "
    "killed as dead",
    "[tcp][multiproc][failure]") {
  // Rank 1 of 3 runs one collective fewer than the others, then shuts its
  // group down and exits (or is killed there). Ranks 0 and 2 wait for it,
  // rank 2 in an all_reduce and rank 0 in one too, or in a receive from it,
  // or a send to it larger than a socket or ring holds, and must name rank
  // 1 as a program that ended early, not as a crash, or the other way
  // round. They keep their groups until both have their errors, so that
  // neither is taken for one that left early.
  const std::string transport = GENERATE("tcp", "auto");
  const bool killed = GENERATE(false, true);
  const std::string rank0_waits = GENERATE("all_reduce", "recv", "send");
  CAPTURE(transport, killed, rank0_waits);
  constexpr int kNamedLeaving = kFirstTestExitCode;
  constexpr int kNamedDead = kFirstTestExitCode + 1;
  const int world = 3, leaver = 1;
  const std::string url = comm::testing::loopback_url(world);
  PipeSignal rank0_done, rank2_done;
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", transport.c_str(), 1);
    auto group = comm::init_process_group("tcp", url, rank, world, 30s);
    comm::Tensor t = comm::Tensor::full({1024}, 1.0, comm::DType::kF32);
    group->all_reduce(t, {comm::ReduceOp::kSum})->wait();
    if (rank == leaver) {
      if (killed) raise(SIGKILL);
      group.reset();  // shut down with nothing pending
      return 0;
    }
    int code = kOtherError;  // served though rank 1 had gone
    try {
      if (rank == 0 && rank0_waits == "recv") {
        group->recv(t, leaver, {.timeout = 20s});
      } else if (rank == 0 && rank0_waits == "send") {
        const comm::Tensor large =
            comm::Tensor::zeros({16 << 20}, comm::DType::kF32);
        group->send(large, leaver, {.timeout = 20s});
      } else {
        group->all_reduce(t, {comm::ReduceOp::kSum, 20s})->wait();
      }
    } catch (const comm::PeerError& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      code = e.peer_rank() != leaver ? kOtherError
             : std::string(e.what()).find(
                   "shut its process group down (after 1 collective, the "
                   "last all_reduce #0") != std::string::npos
                 ? kNamedLeaving
                 : kNamedDead;
    } catch (...) {
      code = comm::testing::failure_exit_code(std::current_exception(), rank,
                                              leaver);
    }
    (rank == 0 ? rank0_done : rank2_done).raise();
    (rank == 0 ? rank2_done : rank0_done).wait(30s);
    return code;
  });
  const int expected = killed ? kNamedDead : kNamedLeaving;
  CHECK(ranks[0]->wait(60s) == expected);
  CHECK(ranks[2]->wait(60s) == expected);
  CHECK(ranks[leaver]->wait(30s) == (killed ? 128 + SIGKILL : 0));
}

TEST_CASE("a rank blocked in a barrier uses almost no CPU",
          "[tcp][multiproc]") {
  const std::string url = comm::testing::loopback_url(2);
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

namespace {

// Sets this process's open-file limits; throws where the kernel refuses.
void limit_open_files(rlim_t soft, rlim_t hard) {
  const rlimit files{soft, hard};
  if (setrlimit(RLIMIT_NOFILE, &files) != 0) {
    throw std::runtime_error("setrlimit(RLIMIT_NOFILE) failed");
  }
}

}  // namespace

TEST_CASE(
    "a rank whose hard open-file limit cannot hold its group fails every rank "
    "at once, saying so",
    "[tcp][multiproc][limits]") {
  // Each rank of 8 needs 3 descriptors a peer at least, and 32 spare,
  // beyond those a forked test process has; 40 is short for rank 2. Over a
  // FileStore no rank hosts a server that its failure would take from the
  // others.
  const int world = 8;
  const int victim = 2;
  const comm::testing::TempPath path("open_file_limit");
  const std::string url =
      "file://" + path.str() + "?world_size=" + std::to_string(world);
  const auto start = std::chrono::steady_clock::now();
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    const std::string reason =
        "rank 2 of a group of 8 needs a limit of at "
        "least";
    try {
      if (rank == victim) limit_open_files(40, 40);
      auto group = comm::init_process_group("tcp", url, rank, world, 20s);
      return 1;
    } catch (const comm::InvalidArgument& e) {
      const std::string text = e.what();
      std::fprintf(stderr, "rank %d: %s\n", rank, text.c_str());
      return rank == victim && text.find(reason) != std::string::npos &&
                     text.find("21 for its 7 peers, 3 each") !=
                         std::string::npos &&
                     text.find("hard limit is 40 (ulimit -Hn)") !=
                         std::string::npos
                 ? kFirstTestExitCode
                 : kOtherError;
    } catch (const comm::PeerError& e) {
      const std::string text = e.what();
      return rank != victim &&
                     text.find("another rank failed") != std::string::npos &&
                     text.find(reason) != std::string::npos
                 ? kFirstTestExitCode
                 : kOtherError;
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              victim);
    }
  });
  // Well before the 20 s each rank would wait for the one that failed.
  CHECK(comm::testing::check_exit_codes(ranks, -1, kFirstTestExitCode, 30s,
                                        start) < 10.0);
}

TEST_CASE("a soft open-file limit below a group's needs is raised",
          "[tcp][multiproc][limits]") {
  // Each rank of 16 keeps 60 descriptors for its peers.
  const int world = 16;
  const std::string url = comm::testing::loopback_url(world);
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    limit_open_files(40, 4096);
    auto group = comm::init_process_group("tcp", url, rank, world, 60s);
    comm::Tensor t = comm::Tensor::full({1024}, rank + 1, comm::DType::kF32);
    group->all_reduce(t, {comm::ReduceOp::kSum, 60s})->wait();
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur <= 40 || files.rlim_max != 4096) {
      return kFirstTestExitCode;
    }
    return t.data<float>()[0] == 136.0f ? 0 : kFirstTestExitCode + 1;
  });
  comm::testing::check_exit_codes(ranks, -1, 0, 60s);
}
