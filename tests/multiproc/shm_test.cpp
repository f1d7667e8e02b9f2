// The shared-memory transport between real rank processes: that local
// ranks use it (their memory maps show the memfd segments), that a rank
// killed with SIGKILL is a PeerError naming it on every other rank within
// 5 s and leaves nothing in /dev/shm, on the rings and on the single-copy
// algorithms that read the peers' memory, that ranks that cannot read a
// peer's memory agree to use the rings, that COMM_TRANSPORT=shm refuses a
// group spanning hosts, and that a group spanning two hosts (two network
// namespaces of two ranks each, made and removed here) uses shared memory
// inside each and TCP between them with the results of a single host.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
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

constexpr int kPeerErrorNamingVictim = 20;
constexpr int kNoSharedMemory = 23;
constexpr int kWrongResult = 24;
constexpr int kOtherError = 22;
constexpr int kUsesDevShm = 25;
constexpr int kDataOverTcp = 26;
constexpr int kCannotForbid = 27;

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) names.insert(entry->d_name);
    closedir(dir);
  }
  return names;
}

// Whether this process maps a shared-memory segment of libcomm's.
bool maps_shared_memory() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:libcomm-shm") != std::string::npos) return true;
  }
  return false;
}

// Whether this process maps or holds open anything under /dev/shm.
bool uses_dev_shm() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm/") != std::string::npos) return true;
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      char target[4096] = {};
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::string(target).starts_with("/dev/shm/")) {
        closedir(dir);
        return true;
      }
    }
    closedir(dir);
  }
  return false;
}

// How many sockets this process holds.
int open_sockets() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::string(target).starts_with("socket:")) {
        ++count;
      }
    }
    closedir(dir);
  }
  return count;
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd entry{fd, POLLIN, 0};
  return poll(&entry, 1, static_cast<int>(timeout.count())) == 1;
}

// Runs `command` through the shell; true when it exits 0.
bool shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Two network namespaces joined by a veth pair, 10.77.0.1 in the first and
// 10.77.0.2 in the second, each with its loopback up; removed on
// destruction. `ok` is false, with `why`, where they cannot be made.
struct TwoHosts {
  std::string names[2];
  bool ok = false;
  std::string why;

  TwoHosts() {
    const std::string tag = std::to_string(getpid());
    names[0] = "lcshm" + tag + "a";
    names[1] = "lcshm" + tag + "b";
    const std::string veth0 = "lcv" + tag + "a", veth1 = "lcv" + tag + "b";
    if (!shell("ip netns add " + names[0]) ||
        !shell("ip netns add " + names[1])) {
      why =
          "cannot create network namespaces (`ip netns add` failed: not "
          "root, or no iproute2)";
      return;
    }
    ok = shell("ip link add " + veth0 + " netns " + names[0] +
               " type veth peer name " + veth1 + " netns " + names[1]) &&
         shell("ip -n " + names[0] + " addr add 10.77.0.1/24 dev " + veth0) &&
         shell("ip -n " + names[1] + " addr add 10.77.0.2/24 dev " + veth1) &&
         shell("ip -n " + names[0] + " link set " + veth0 + " up") &&
         shell("ip -n " + names[1] + " link set " + veth1 + " up") &&
         shell("ip -n " + names[0] + " link set lo up") &&
         shell("ip -n " + names[1] + " link set lo up");
    if (!ok) why = "cannot join the namespaces with a veth pair";
  }
  ~TwoHosts() {
    for (const auto& name : names) shell("ip netns del " + name);
  }
  // Moves the calling (single-threaded, child) process into host `h`.
  void enter(int h) const {
    const int fd = open(("/var/run/netns/" + names[h]).c_str(), O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      throw std::runtime_error("setns into " + names[h] + " failed");
    }
    close(fd);
  }
};

// Every collective and point-to-point on `group`, checked against values
// computed here (integers, exact in float32 and the same bits everywhere).
int check_collectives(comm::ProcessGroup& group) {
  const int rank = group.rank(), world = group.size();
  for (std::int64_t count : {0L, 1L, 1009L, 300007L}) {
    comm::Tensor t = comm::Tensor::empty({count}, comm::DType::kF32);
    auto* v = static_cast<float*>(t.data_ptr());
    for (std::int64_t i = 0; i < count; ++i) v[i] = float(rank * 3 + i % 7);
    group.all_reduce(t)->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      const float expected =
          float(3 * world * (world - 1) / 2 + world * (i % 7));
      if (v[i] != expected) return kWrongResult;
    }
    comm::Tensor b =
        comm::Tensor::full({count}, double(rank + 1), comm::DType::kF32);
    group.broadcast(b, {.root = world - 1})->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      if (static_cast<float*>(b.data_ptr())[i] != float(world)) {
        return kWrongResult;
      }
    }
    comm::Tensor mine =
        comm::Tensor::full({count}, double(rank), comm::DType::kI32);
    comm::Tensor all = comm::Tensor::empty({count * world}, comm::DType::kI32);
    group.all_gather_into(all, mine)->wait();
    for (std::int64_t i = 0; i < count * world; ++i) {
      if (static_cast<std::int32_t*>(all.data_ptr())[i] != i / count) {
        return kWrongResult;
      }
    }
  }
  comm::Tensor in = comm::Tensor::empty({world * 5}, comm::DType::kI64);
  comm::Tensor out = comm::Tensor::empty({world * 5}, comm::DType::kI64);
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
// COMM_SHM_DIRECT_THRESHOLD_BYTES (nullptr: the default).
void kill_during_all_reduce(const char* threshold, std::int64_t count) {
  const std::set<std::string> before = dev_shm_entries();
  const int world = 4, victim = 1;
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port()) +
      "?world_size=" + std::to_string(world);
  int started[2];
  REQUIRE(pipe(started) == 0);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=] {
      setenv("COMM_TRANSPORT", "shm", 1);
      if (threshold != nullptr) {
        setenv("COMM_SHM_DIRECT_THRESHOLD_BYTES", threshold, 1);
      }
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
        if (const int bad = check_collectives(*group)) return bad;
        comm::Tensor t = comm::Tensor::full({count}, 1.0, comm::DType::kF32);
        for (int i = 0; i < 100000; ++i) {
          group->all_reduce(t, {comm::ReduceOp::kMax, 60s})->wait();
          if (i == 0 && rank == 0) (void)!write(started[1], "x", 1);
        }
        return 0;
      } catch (const comm::PeerError& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        if (uses_dev_shm()) return kUsesDevShm;
        return e.peer_rank() == victim &&
                       std::string(e.what()).find("rank " +
                                                  std::to_string(victim)) !=
                           std::string::npos
                   ? kPeerErrorNamingVictim
                   : kOtherError;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        return kOtherError;
      }
    }));
  }
  const bool looping = wait_readable(started[0], 120s);
  close(started[0]);
  close(started[1]);
  if (!looping) {
    for (int rank = 0; rank < world; ++rank) {
      INFO("rank " << rank);
      CHECK(ranks[rank]->wait(1s) == 0);
    }
    FAIL("the ranks never reached their loop");
  }
  std::this_thread::sleep_for(50ms);
  ranks[victim]->kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  for (int rank = 0; rank < world; ++rank) {
    if (rank == victim) continue;
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(5s) == kPeerErrorNamingVictim);
  }
  CHECK(std::chrono::steady_clock::now() - killed < 5s + 500ms);
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
    "ranks that cannot read a peer's memory agree to use the rings, with "
    "the same results",
    "[shm][multiproc][single_copy]") {
  const int world = 3, unreadable = 1;
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port()) +
      "?world_size=" + std::to_string(world);
  int pids[2];
  REQUIRE(pipe(pids) == 0);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=] {
      setenv("COMM_TRANSPORT", "shm", 1);
      setenv("COMM_SHM_DIRECT_THRESHOLD_BYTES", "1", 1);
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
    }));
  }
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
  TwoHosts hosts;
  if (!hosts.ok) {
    WARN("SKIPPED: " << hosts.why);
    return;
  }
  const int world = 4;
  const std::string url = "tcp://10.77.0.1:29517?world_size=4";
  auto run = [&](const char* transport) {
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int rank = 0; rank < world; ++rank) {
      const int host = rank / 2;  // ranks 0, 1 on one host; 2, 3 on the other
      ranks.push_back(std::make_unique<ChildProcess>([=, &hosts] {
        hosts.enter(host);
        setenv("COMM_TRANSPORT", transport, 1);
        setenv("COMM_TCP_ADDR", host == 0 ? "10.77.0.1" : "10.77.0.2", 1);
        try {
          auto group = comm::init_process_group("tcp", url, rank, world, 30s);
          if (!maps_shared_memory()) return kNoSharedMemory;
          return check_collectives(*group);
        } catch (const comm::InvalidArgument& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          return std::string(e.what()).find("COMM_TRANSPORT=shm") !=
                         std::string::npos
                     ? 30
                     : kOtherError;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          return kOtherError;
        }
      }));
    }
    std::vector<int> codes;
    for (auto& r : ranks) codes.push_back(r->wait(120s));
    return codes;
  };
  SECTION("auto: every result as on one host") {
    const auto codes = run("auto");
    for (int rank = 0; rank < world; ++rank) {
      INFO("rank " << rank);
      CHECK(codes[rank] == 0);
    }
  }
  SECTION("shm: group creation fails saying why") {
    const auto codes = run("shm");
    for (int rank = 0; rank < world; ++rank) {
      INFO("rank " << rank);
      CHECK(codes[rank] == 30);
    }
  }
}
