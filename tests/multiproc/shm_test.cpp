// The shared-memory transport between real rank processes: that local
// ranks use it (their memory maps show the memfd segments), that a rank
// killed with SIGKILL is a PeerError naming it on every other rank within
// 5 s and leaves nothing in /dev/shm, on the rings and on the single-copy
// algorithms that read the peers' memory, and at any point of the
// group's set-up, that ranks that cannot read a
// peer's memory agree to use the rings, that COMM_TRANSPORT=shm refuses a
// group spanning hosts, and that a group spanning two hosts (two network
// namespaces of two ranks each, made and removed here) uses shared memory
// inside each and TCP between them with the results of a single host; and
// that 32 ranks of an unprivileged user set up their segments.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <grp.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "support/namespace_pair.h"
#include "support/rank_processes.h"
#include "support/rank_stores.h"
#include "support/shared_host_mappings.h"

using comm::testing::kFirstTestExitCode;
using comm::testing::kOtherError;
using comm::testing::kPeerErrorNamingVictim;
using comm::testing::NamespacePair;
using comm::testing::PipeSignal;
using comm::testing::shared_host_mappings;
using namespace std::chrono_literals;

namespace {

// This test's own exit codes of a rank, beside rank_processes.h's.
constexpr int kNoSharedMemory = kFirstTestExitCode;
constexpr int kWrongResult = kFirstTestExitCode + 1;
constexpr int kUsesDevShm = kFirstTestExitCode + 2;
constexpr int kDataOverTcp = kFirstTestExitCode + 3;
// Group creation refused COMM_TRANSPORT=shm for a group spanning hosts.
constexpr int kShmRefusedAcrossHosts = kFirstTestExitCode + 4;
// A rank's memory could not be made unreadable to the others here.
constexpr int kCannotForbid = kFirstTestExitCode + 5;
// A rank whose tensors were in shared host memory mapped none of its peers'.
constexpr int kNotMapped = kFirstTestExitCode + 6;

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) names.insert(entry->d_name);
    closedir(dir);
  }
  return names;
}

// Whether a mapping of this process names `needle` (/proc/self/maps).
bool maps(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

// How many of this process's open files' names start with `prefix`.
int open_files(const std::string& prefix) {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      char target[4096] = {};
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::string(target).starts_with(prefix)) {
        ++count;
      }
    }
    closedir(dir);
  }
  return count;
}

// Whether this process maps a shared-memory segment of libcomm's.
bool maps_shared_memory() { return maps("memfd:libcomm-shm"); }

// Whether this process maps or holds open anything under /dev/shm.
bool uses_dev_shm() { return maps("/dev/shm/") || open_files("/dev/shm/") > 0; }

// How many sockets this process holds.
int open_sockets() { return open_files("socket:"); }

// A tensor of `count` elements of `dtype`, each `value`; in shared host
// memory (libcomm/shared_host_memory.h) where `shared`.
comm::Tensor filled(std::int64_t count, comm::DType dtype, double value,
                    bool shared) {
  comm::Tensor t = comm::Tensor::full({count}, value, dtype);
  if (!shared) return t;
  comm::Tensor in_shared = comm::Tensor::shared_host_zeros({count}, dtype);
  in_shared.copy_(t);
  return in_shared;
}

// Every collective and point-to-point on `group`, checked against values
// computed here (integers, exact in float32 and the same bits everywhere),
// on tensors in shared host memory where `shared`.
int check_collectives(comm::ProcessGroup& group, bool shared = false) {
  const int rank = group.rank(), world = group.size();
  for (std::int64_t count : {0L, 1L, 1009L, 300007L}) {
    comm::Tensor t = filled(count, comm::DType::kF32, 0, shared);
    auto* v = static_cast<float*>(t.data_ptr());
    for (std::int64_t i = 0; i < count; ++i) v[i] = float(rank * 3 + i % 7);
    group.all_reduce(t)->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      const float expected =
          float(3 * world * (world - 1) / 2 + world * (i % 7));
      if (v[i] != expected) return kWrongResult;
    }
    comm::Tensor b = filled(count, comm::DType::kF32, rank + 1, shared);
    group.broadcast(b, {.root = world - 1})->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      if (static_cast<float*>(b.data_ptr())[i] != float(world)) {
        return kWrongResult;
      }
    }
    comm::Tensor mine = filled(count, comm::DType::kI32, rank, shared);
    comm::Tensor all = filled(count * world, comm::DType::kI32, 0, shared);
    group.all_gather_into(all, mine)->wait();
    for (std::int64_t i = 0; i < count * world; ++i) {
      if (static_cast<std::int32_t*>(all.data_ptr())[i] != i / count) {
        return kWrongResult;
      }
    }
  }
  comm::Tensor in = filled(world * 5, comm::DType::kI64, 0, shared);
  comm::Tensor out = filled(world * 5, comm::DType::kI64, 0, shared);
  for (int i = 0; i < world * 5; ++i) {
    static_cast<std::int64_t*>(in.data_ptr())[i] = rank * 100 + i;
  }
  group.all_to_all(out, in)->wait();
  for (int i = 0; i < world * 5; ++i) {
    const std::int64_t expected = (i / 5) * 100 + rank * 5 + i % 5;
    if (static_cast<std::int64_t*>(out.data_ptr())[i] != expected) {
      return kWrongResult;
    }
  }
  // A message around the ring of ranks, across the hosts.
  comm::Tensor msg =
      comm::Tensor::full({70001}, double(rank), comm::DType::kF64);
  comm::Tensor got = comm::Tensor::empty({70001}, comm::DType::kF64);
  auto sent = group.isend(msg, (rank + 1) % world);
  group.recv(got, (rank + world - 1) % world);
  sent->wait();
  if (static_cast<double*>(got.data_ptr())[70000] !=
      double((rank + world - 1) % world)) {
    return kWrongResult;
  }
  group.barrier()->wait();
  return 0;
}

// Removes CAP_SYS_PTRACE from this process's effective capabilities, so
// that it may read another process's memory only where the kernel's
// ordinary rules allow (same user, and the other process dumpable).
bool drop_ptrace_capability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  return syscall(SYS_capset, &header, data) == 0;
}

// Runs `world` ranks over shared memory, checks their collectives, loops
// on all_reduce of `count` floats, and kills rank 1 with SIGKILL once the
// loop runs: every other rank must fail with PeerError naming it within
// 5 s, and nothing may be left in /dev/shm. `threshold` sets
// COMM_SHM_DIRECT_THRESHOLD_BYTES and COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES
// (nullptr: the defaults). With `shared`, every tensor is in shared host
// memory, which the ranks read through mappings from one byte on
// (COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES).
void kill_during_all_reduce(const char* threshold, std::int64_t count,
                            bool shared = false) {
  const std::set<std::string> before = dev_shm_entries();
  const int world = 4, victim = 1;
  const std::string url = comm::testing::loopback_url(world);
  PipeSignal started;
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", "shm", 1);
    if (threshold != nullptr) {
      setenv("COMM_SHM_DIRECT_THRESHOLD_BYTES", threshold, 1);
      setenv("COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", threshold, 1);
    }
    if (shared) setenv("COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES", "1", 1);
    try {
      auto group = comm::init_process_group("tcp", url, rank, world, 30s);
      if (!maps_shared_memory()) return kNoSharedMemory;
      // Local ranks open no TCP data connection to each other: a rank
      // that does not host the store holds one control connection per
      // peer and at most two to the store (over TCP it would hold
      // three connections per peer).
      if (rank != 0 && open_sockets() > (world - 1) + 2) {
        return kDataOverTcp;
      }
      if (const int bad = check_collectives(*group, shared)) return bad;
      // Every tensor of the checks is freed now: what this rank still maps
      // are the peers' last blocks, which it read through mappings.
      if (shared && shared_host_mappings() == 0) return kNotMapped;
      comm::testing::all_reduce_rounds(*group, count, 100000, 60s, started,
                                       shared);
      return 0;
    } catch (...) {
      const int code = comm::testing::failure_exit_code(
          std::current_exception(), rank, victim);
      return uses_dev_shm() ? kUsesDevShm : code;
    }
  });
  if (!started.wait(120s)) {
    comm::testing::check_exit_codes(ranks, -1, 0, 1s);
    FAIL("the ranks never reached their loop");
  }
  std::this_thread::sleep_for(50ms);
  ranks[victim]->kill(SIGKILL);
  CHECK(comm::testing::check_exit_codes(ranks, victim, kPeerErrorNamingVictim,
                                        5s) < 5.5);
  CHECK(ranks[victim]->wait(5s) == 128 + SIGKILL);
  // Nothing any rank made is left behind: the segments were memfds.
  // Other programs on a shared machine make entries too: Python's
  // multiprocessing makes sem.mp-*, which libcomm never makes.
  std::vector<std::string> left;
  for (const auto& name : dev_shm_entries()) {
    if (!before.count(name) && !name.starts_with("sem.mp-")) {
      left.push_back(name);
    }
  }
  INFO("new in /dev/shm: " << left.size());
  for (const auto& name : left) INFO(name);
  CHECK(left.empty());
}

}  // namespace

TEST_CASE(
    "local ranks over shared memory: results, and a SIGKILL is a "
    "PeerError naming the victim that leaves nothing in /dev/shm",
    "[shm][multiproc][failure]") {
  // 4 MiB, on the rings.
  kill_during_all_reduce("1073741824", 1 << 20);
}

TEST_CASE(
    "single copy between processes: results, and a SIGKILL during a large "
    "all_reduce that reads the peers' memory is a PeerError naming the "
    "victim within 5 s",
    "[shm][multiproc][failure][single_copy]") {
  // Every collective that carries data reads the peers' memory; the loop
  // runs all_reduce of 16 MiB.
  kill_during_all_reduce("1", 4 << 20);
}

TEST_CASE(
    "shared host memory between processes: results through mappings, and "
    "a SIGKILL during an all_reduce that reads it is a PeerError naming "
    "the victim within 5 s",
    "[shm][multiproc][failure][shared_host]") {
  kill_during_all_reduce(nullptr, 4 << 20, true);
}

namespace {

// Two ranks over shared memory. Rank 1, the victim, sends rank 0 a float32
// message of 4 elements, all `value`, with `tag`, then meets it in a
// barrier and pauses until it is killed with SIGKILL, 200 ms later; rank 0
// runs `survivor` after the barrier and exits with what it returns (a
// failure: failure_exit_code's code). Rank 0 must exit with `expected`
// within 5 s of the kill.
void kill_after_p2p(int tag, float value,
                    const std::function<int(comm::ProcessGroup&)>& survivor,
                    int expected) {
  const int world = 2, victim = 1;
  const std::string url = comm::testing::loopback_url(world);
  PipeSignal started;
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", "shm", 1);
    try {
      auto group = comm::init_process_group("tcp", url, rank, world, 60s);
      if (rank == victim) {
        group
            ->isend(comm::Tensor::full({4}, value, comm::DType::kF32), 0, {tag})
            ->wait();
        group->barrier()->wait();
        started.raise();
        pause();
        return 0;
      }
      group->barrier()->wait();
      return survivor(*group);
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              victim);
    }
  });
  if (!started.wait(60s)) {
    comm::testing::check_exit_codes(ranks, -1, 0, 1s);
    FAIL("the victim never reached its pause");
  }
  std::this_thread::sleep_for(200ms);
  ranks[victim]->kill(SIGKILL);
  CHECK(comm::testing::check_exit_codes(ranks, victim, expected, 10s) < 5.5);
  CHECK(ranks[victim]->wait(5s) == 128 + SIGKILL);
}

}  // namespace

TEST_CASE(
    "a send that waits for room in the ring to a rank killed with a "
    "message left unread fails naming it within 5 s",
    "[shm][multiproc][failure][p2p]") {
  // The victim's message stays in the ring to rank 0, which never posts
  // its receive; rank 0's send does not fit in the ring the other way.
  // Once the victim is gone, nobody will make room: the send must fail
  // then, not at its timeout (60 s), whatever the ring still holds.
  kill_after_p2p(
      0, 1.0f,
      [](comm::ProcessGroup& group) {
        comm::Tensor big =
            comm::Tensor::full({1 << 20}, 1.0, comm::DType::kF32);
        group.isend(big, 1)->wait();
        return 0;
      },
      kPeerErrorNamingVictim);
}

TEST_CASE(
    "a message that arrived before its sender was killed is still received",
    "[shm][multiproc][failure][p2p]") {
  // Rank 0 waits for tag 9, so it reads the victim's tag-5 message and
  // keeps it. The kill fails the tag-9 receive and the channel; a receive
  // of tag 5 posted after that still gets the message, as bytes a socket
  // took in before its peer reset it are still read.
  kill_after_p2p(
      5, 5.0f,
      [](comm::ProcessGroup& group) {
        comm::Tensor nine = comm::Tensor::zeros({4}, comm::DType::kF32);
        try {
          group.irecv(nine, 1, {9})->wait();
          return kWrongResult;
        } catch (...) {
          const int code =
              comm::testing::failure_exit_code(std::current_exception(), 0, 1);
          if (code != kPeerErrorNamingVictim) return code;
        }
        comm::Tensor five = comm::Tensor::zeros({4}, comm::DType::kF32);
        group.recv(five, 1, {5});
        return five.data<float>()[3] == 5.0f ? 0 : kWrongResult;
      },
      0);
}

TEST_CASE(
    "a rank whose file size limit is below its segment fails the group's "
    "creation saying so, and its peers name it at once",
    "[shm][multiproc][failure]") {
  // Sizing the segment past RLIMIT_FSIZE would raise SIGXFSZ, which ends
  // the rank in the middle of the set-up.
  const int world = 2;
  const std::string url = comm::testing::loopback_url(world);
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", "shm", 1);
    if (rank == 1) {
      // Ignored, so that a write of this rank's to a log file past the
      // limit fails rather than ends it; the message below shows that the
      // limit was checked before the segment was sized.
      signal(SIGXFSZ, SIG_IGN);
      rlimit small{};
      if (getrlimit(RLIMIT_FSIZE, &small) != 0) return kOtherError;
      small.rlim_cur = 4096;
      if (setrlimit(RLIMIT_FSIZE, &small) != 0) return kOtherError;
    }
    try {
      comm::init_process_group("tcp", url, rank, world, 30s);
      return kWrongResult;
    } catch (const comm::PeerError& e) {
      return rank == 0 &&
                     std::string(e.what()).find("rank 1") != std::string::npos
                 ? 0
                 : kOtherError;
    } catch (const comm::SystemError& e) {
      return rank == 1 && std::string(e.what()).find("file size limit") !=
                              std::string::npos
                 ? 0
                 : kOtherError;
    } catch (...) {
      return kOtherError;
    }
  });
  // At once, not at the set-up's deadline (30 s).
  CHECK(comm::testing::check_exit_codes(ranks, -1, 0, 60s) < 10);
}

TEST_CASE(
    "a local rank killed at any point of the group's set-up is a PeerError "
    "naming it within 5 s",
    "[shm][multiproc][failure]") {
  // Rank 2 of 4 dies right after it publishes, in turn: its identity
  // (before its inbox), its inbox (before its segment), its word on single
  // copy (before its address), its address (before its connections), and
  // its arrival at the set-up's last barrier. Its peers wait for it at each
  // point, with a deadline of 60 s. Each rank keeps its store until its
  // process ends, as a program does: rank 0's, which hosts the server,
  // then goes when rank 0 has found the death, and ranks 1 and 3 must
  // still name rank 2, not rank 0.
  const char* fatal_key = GENERATE("shm/host/2", "shm/inbox/2", "shm/copy/2",
                                   "tcp/addr/2", "tcp/connected/rank/2");
  INFO("rank 2 dies after setting " << fatal_key);
  const int world = 4, victim = 2;
  const std::uint16_t port = comm::detail::free_loopback_port();
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", "shm", 1);
    try {
      auto store = comm::testing::kept_rank_store(rank, port);
      if (rank == victim) {
        store = std::make_shared<comm::testing::DyingStore>(*store, fatal_key);
      }
      comm::ProcessGroup group(store, rank, world, "tcp", 60s);
      return kWrongResult;  // a group without rank 2's part
    } catch (...) {
      return comm::testing::failure_exit_code(std::current_exception(), rank,
                                              victim);
    }
  });
  REQUIRE(ranks[victim]->wait(60s) == 128 + SIGKILL);
  const auto died = std::chrono::steady_clock::now();
  CHECK(comm::testing::check_exit_codes(ranks, victim, kPeerErrorNamingVictim,
                                        60s, died) < 5.5);
}

TEST_CASE(
    "ranks that cannot read a peer's memory agree to use the rings, with "
    "the same results",
    "[shm][multiproc][single_copy]") {
  const int world = 3, unreadable = 1;
  const std::string url = comm::testing::loopback_url(world);
  int pids[2];
  REQUIRE(pipe(pids) == 0);
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    setenv("COMM_TRANSPORT", "shm", 1);
    setenv("COMM_SHM_DIRECT_THRESHOLD_BYTES", "1", 1);
    setenv("COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1", 1);
    // A process that is not dumpable may have its memory read only by a
    // process with CAP_SYS_PTRACE, which no rank keeps.
    if (!drop_ptrace_capability()) return kCannotForbid;
    if (rank == unreadable) {
      if (prctl(PR_SET_DUMPABLE, 0) != 0) return kCannotForbid;
      const pid_t me = getpid();
      for (int r = 1; r < world; ++r) {
        if (write(pids[1], &me, sizeof(me)) != sizeof(me)) return kOtherError;
      }
    } else {
      pid_t target = 0;
      if (read(pids[0], &target, sizeof(target)) != sizeof(target)) {
        return kOtherError;
      }
      std::uint64_t word = 0;
      const iovec local{&word, sizeof(word)};
      const iovec remote{&word, sizeof(word)};
      if (process_vm_readv(target, &local, 1, &remote, 1, 0) >= 0 ||
          errno != EPERM) {
        return kCannotForbid;
      }
    }
    try {
      auto group = comm::init_process_group("tcp", url, rank, world, 30s);
      return check_collectives(*group);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return kOtherError;
    }
  });
  close(pids[0]);
  close(pids[1]);
  std::vector<int> codes;
  for (auto& r : ranks) codes.push_back(r->wait(120s));
  if (std::find(codes.begin(), codes.end(), kCannotForbid) != codes.end()) {
    WARN("SKIPPED: a rank's memory could not be made unreadable here");
    return;
  }
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(codes[rank] == 0);
  }
}

TEST_CASE("a group spanning two hosts: shared memory inside, TCP between",
          "[shm][multiproc][hosts]") {
  NamespacePair hosts;
  if (!hosts.ok()) {
    WARN("SKIPPED: cannot create two network namespaces: " << hosts.why());
    return;
  }
  const int world = 4;
  // Rank 0's namespace is fresh: any port is free there.
  const std::string url =
      "tcp://" + NamespacePair::address(0) + ":29517?world_size=4";
  auto start = [&](const char* transport) {
    return comm::testing::start_ranks(world, [&](int rank) {
      const int host = rank / 2;  // ranks 0, 1 on one host; 2, 3 on the other
      if (!hosts.enter(host)) {
        std::fprintf(stderr, "rank %d: setns failed\n", rank);
        return kOtherError;
      }
      setenv("COMM_TRANSPORT", transport, 1);
      setenv("COMM_TCP_ADDR", NamespacePair::address(host).c_str(), 1);
      try {
        auto group = comm::init_process_group("tcp", url, rank, world, 30s);
        if (!maps_shared_memory()) return kNoSharedMemory;
        return check_collectives(*group);
      } catch (const comm::InvalidArgument& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        return std::string(e.what()).find("COMM_TRANSPORT=shm") !=
                       std::string::npos
                   ? kShmRefusedAcrossHosts
                   : kOtherError;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        return kOtherError;
      }
    });
  };
  SECTION("auto: every result as on one host") {
    auto ranks = start("auto");
    comm::testing::check_exit_codes(ranks, -1, 0, 120s);
  }
  SECTION("shm: group creation fails saying why") {
    auto ranks = start("shm");
    comm::testing::check_exit_codes(ranks, -1, kShmRefusedAcrossHosts, 120s);
  }
}

TEST_CASE(
    "32 ranks of an unprivileged user pass each other their segments, more "
    "descriptors than the kernel lets a user have in flight at once",
    "[shm][multiproc][limits]") {
  // Each rank sends 4 descriptors to each of 31 peers; the kernel refuses a
  // send (ETOOMANYREFS) while the user's descriptors in flight over Unix
  // sockets pass the sender's soft limit of open files, set to 1024 here.
  // Root is exempt, so the ranks run as nobody where the test is root.
  if (geteuid() != 0) {
    WARN("SKIPPED: needs root, to run its ranks as the user nobody");
    return;
  }
  const int world = 32;
  const std::string url = comm::testing::loopback_url(world);
  auto ranks = comm::testing::start_ranks(world, [&](int rank) {
    const rlimit files{1024, 4096};
    if (setrlimit(RLIMIT_NOFILE, &files) != 0 || setgroups(0, nullptr) != 0 ||
        setgid(65534) != 0 || setuid(65534) != 0) {
      return kOtherError;
    }
    auto group = comm::init_process_group("tcp", url, rank, world, 60s);
    if (!maps_shared_memory()) return kFirstTestExitCode;
    comm::Tensor t = comm::Tensor::full({256}, 1.0, comm::DType::kF32);
    group->all_reduce(t)->wait();
    return t.data<float>()[0] == 32.0f ? 0 : kFirstTestExitCode + 1;
  });
  comm::testing::check_exit_codes(ranks, -1, 0, 90s);
}
