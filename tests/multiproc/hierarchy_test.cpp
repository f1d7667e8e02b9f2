// Collectives over a group spanning two hosts (two network namespaces, made
// and removed here), which run hierarchically: shared memory inside each
// host, TCP between them (backends/tcp/hierarchy.h). Every collective is
// checked against values computed here; every result that all ranks hold
// is checked to be bitwise the same on each (each rank writes a digest of
// each such result to a file that the test compares); and with two hosts
// of two ranks that alternate (ranks 0 and 2 on one host, 1 and 3 on the
// other), a large all_reduce is checked to send each host's share over the
// link between the hosts once, about the message's size each way, where a
// flat ring over the ranks in rank order crosses between the hosts at
// every step and sends three times that. The uneven cases put three ranks
// on one host and one on the other, in namespaces, and on this host, where
// the one is a rank that asked for COMM_TRANSPORT=tcp. Ranks that name
// different roots of a small scatter across the hosts fail with
// MismatchError.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "support/child_process.h"
#include "support/namespace_pair.h"
#include "support/rank_processes.h"
#include "support/rank_stores.h"
#include "support/temp_path.h"

using comm::DType;
using comm::ReduceOp;
using comm::Tensor;
using comm::testing::ChildProcess;
using comm::testing::NamespacePair;
using comm::testing::TempPath;
using namespace std::chrono_literals;

namespace {

constexpr int kWrongResult = 24;
constexpr int kTooMuchTraffic = 27;
constexpr int kOtherError = 22;

// A wrong result, with what and where.
struct WrongResult : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect(bool condition, const std::string& what) {
  if (!condition) throw WrongResult(what);
}

template <typename T>
T* data(Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// FNV-1a over a tensor's bytes: equal digests, equal bytes (but for a
// collision no test data comes near).
std::uint64_t digest(const Tensor& t) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

// Values whose sums round differently in different orders.
float inexact(int rank, std::int64_t i) {
  return 1.0f / static_cast<float>(1 + (rank * 7 + i) % 29) +
         static_cast<float>(rank) * 1e-3f;
}

// Runs every collective on `group`, checking each result against values
// computed here, and writes "name digest" to `digests` for every result
// that every rank holds.
void check_collectives(comm::ProcessGroup& group, std::ostream& digests) {
  const int rank = group.rank(), world = group.size();
  auto note = [&](const std::string& name, const Tensor& t) {
    digests << name << " " << digest(t) << "\n";
  };
  // all_reduce: small sizes (leaders), the ring threshold (64 KiB at
  // world 4) and past it, in place and out of place.
  for (std::int64_t count :
       {0L, 1L, 1009L, 16384L, 16385L, 300007L, 1L << 20}) {
    for (bool in_place : {true, false}) {
      const std::string where = in_place ? " in place" : " out of place";
      // Integers, exact in float32 whatever the order.
      Tensor exact = Tensor::empty({count}, DType::kF32);
      for (std::int64_t i = 0; i < count; ++i) {
        data<float>(exact)[i] = float(rank * 3 + i % 7);
      }
      Tensor exact_out = in_place ? exact : Tensor::empty({count}, DType::kF32);
      if (in_place) {
        group.all_reduce(exact)->wait();
      } else {
        group.all_reduce_into(exact_out, exact)->wait();
      }
      for (std::int64_t i = 0; i < count; ++i) {
        const float expected =
            float(3 * world * (world - 1) / 2 + world * (i % 7));
        expect(data<float>(exact_out)[i] == expected,
               "all_reduce " + std::to_string(count) + where + " element " +
                   std::to_string(i));
      }
      note("all_reduce exact " + std::to_string(count) + where, exact_out);
      // Sums that round by order: the same bits on every rank, near the
      // exact sum.
      Tensor rounded = Tensor::empty({count}, DType::kF32);
      for (std::int64_t i = 0; i < count; ++i) {
        data<float>(rounded)[i] = inexact(rank, i);
      }
      Tensor rounded_out =
          in_place ? rounded : Tensor::empty({count}, DType::kF32);
      if (in_place) {
        group.all_reduce(rounded)->wait();
      } else {
        group.all_reduce_into(rounded_out, rounded)->wait();
      }
      for (std::int64_t i = 0; i < count; ++i) {
        double expected = 0;
        for (int r = 0; r < world; ++r) expected += inexact(r, i);
        expect(std::fabs(data<float>(rounded_out)[i] - expected) <=
                   1e-5 * expected,
               "rounded all_reduce " + std::to_string(count) + where +
                   " element " + std::to_string(i));
      }
      note("all_reduce rounded " + std::to_string(count) + where, rounded_out);
    }
  }
  for (std::int64_t count : {7L, 300007L}) {
    Tensor average = Tensor::empty({count}, DType::kF64);
    for (std::int64_t i = 0; i < count; ++i) {
      data<double>(average)[i] = 1.0 / double(1 + (rank * 5 + i) % 31);
    }
    group.all_reduce(average, {ReduceOp::kAvg})->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      double expected = 0;
      for (int r = 0; r < world; ++r)
        expected += 1.0 / double(1 + (r * 5 + i) % 31);
      expect(std::fabs(data<double>(average)[i] - expected / world) <= 1e-12,
             "average element " + std::to_string(i));
    }
    note("all_reduce avg " + std::to_string(count), average);
    Tensor maximum = Tensor::empty({count}, DType::kI32);
    for (std::int64_t i = 0; i < count; ++i) {
      data<std::int32_t>(maximum)[i] = std::int32_t((rank * 13 + i) % 17) - 8;
    }
    group.all_reduce(maximum, {ReduceOp::kMax})->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      std::int32_t expected = -8;
      for (int r = 0; r < world; ++r) {
        expected = std::max(expected, std::int32_t((r * 13 + i) % 17) - 8);
      }
      expect(data<std::int32_t>(maximum)[i] == expected,
             "max element " + std::to_string(i));
    }
  }
  // broadcast and reduce from roots on both hosts.
  for (int root = 0; root < world; ++root) {
    for (std::int64_t count : {1L, 1009L, 300007L}) {
      Tensor b = Tensor::empty({count}, DType::kF32);
      for (std::int64_t i = 0; i < count; ++i) {
        data<float>(b)[i] = rank == root ? inexact(root, i) : -1.0f;
      }
      group.broadcast(b, {.root = root})->wait();
      for (std::int64_t i = 0; i < count; ++i) {
        expect(data<float>(b)[i] == inexact(root, i),
               "broadcast from " + std::to_string(root) + " element " +
                   std::to_string(i));
      }
      note("broadcast " + std::to_string(count) + " from " +
               std::to_string(root),
           b);
    }
    for (std::int64_t count : {1L, 300007L}) {
      Tensor t = Tensor::empty({count}, DType::kI64);
      for (std::int64_t i = 0; i < count; ++i) {
        data<std::int64_t>(t)[i] = (rank + 1) * (1000 + i);
      }
      group.reduce(t, {.root = root})->wait();
      if (rank != root) continue;
      for (std::int64_t i = 0; i < count; ++i) {
        expect(data<std::int64_t>(t)[i] == world * (world + 1) / 2 * (1000 + i),
               "reduce to " + std::to_string(root) + " element " +
                   std::to_string(i));
      }
    }
  }
  // all_gather (both forms) and reduce_scatter: direct and ring sizes.
  for (std::int64_t count : {1L, 1009L, 70001L}) {
    Tensor mine = Tensor::empty({count}, DType::kI32);
    for (std::int64_t i = 0; i < count; ++i) {
      data<std::int32_t>(mine)[i] = std::int32_t(rank * 1000003 + i);
    }
    std::vector<Tensor> blocks;
    for (int r = 0; r < world; ++r) {
      blocks.push_back(Tensor::zeros({count}, DType::kI32));
    }
    group.all_gather(blocks, mine)->wait();
    Tensor all = Tensor::empty({count * world}, DType::kI32);
    group.all_gather_into(all, mine)->wait();
    for (int r = 0; r < world; ++r) {
      for (std::int64_t i = 0; i < count; ++i) {
        const auto expected = std::int32_t(r * 1000003 + i);
        expect(data<std::int32_t>(blocks[r])[i] == expected &&
                   data<std::int32_t>(all)[r * count + i] == expected,
               "all_gather " + std::to_string(count) + " block " +
                   std::to_string(r));
      }
    }
    note("all_gather " + std::to_string(count), all);

    std::vector<Tensor> inputs;
    for (int r = 0; r < world; ++r) {
      Tensor in = Tensor::empty({count}, DType::kI32);
      for (std::int64_t i = 0; i < count; ++i) {
        data<std::int32_t>(in)[i] = std::int32_t(rank * 7 + r * 11 + i % 1013);
      }
      inputs.push_back(in);
    }
    Tensor out = Tensor::empty({count}, DType::kI32);
    group.reduce_scatter(out, inputs)->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      std::int32_t expected = 0;
      for (int q = 0; q < world; ++q) {
        expected += std::int32_t(q * 7 + rank * 11 + i % 1013);
      }
      expect(data<std::int32_t>(out)[i] == expected,
             "reduce_scatter " + std::to_string(count) + " element " +
                 std::to_string(i));
    }
  }
  // all_to_all, gather and scatter.
  for (std::int64_t count : {5L, 30001L}) {
    Tensor in = Tensor::empty({world * count}, DType::kI64);
    Tensor out = Tensor::empty({world * count}, DType::kI64);
    for (std::int64_t i = 0; i < world * count; ++i) {
      data<std::int64_t>(in)[i] = rank * 10000000 + i;
    }
    group.all_to_all(out, in)->wait();
    for (std::int64_t i = 0; i < world * count; ++i) {
      const std::int64_t expected =
          (i / count) * 10000000 + rank * count + i % count;
      expect(data<std::int64_t>(out)[i] == expected,
             "all_to_all element " + std::to_string(i));
    }
  }
  for (int root = 0; root < world; ++root) {
    const std::int64_t count = 1009;
    Tensor mine = Tensor::full({count}, double(rank * 10 + root), DType::kI32);
    std::vector<Tensor> gathered;
    if (rank == root) {
      for (int r = 0; r < world; ++r) {
        gathered.push_back(Tensor::zeros({count}, DType::kI32));
      }
    }
    group.gather(gathered, mine, {.root = root})->wait();
    for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
      for (std::int64_t i = 0; i < count; ++i) {
        expect(data<std::int32_t>(gathered[r])[i] == r * 10 + root,
               "gather to " + std::to_string(root));
      }
    }
    std::vector<Tensor> parts;
    if (rank == root) {
      for (int r = 0; r < world; ++r) {
        parts.push_back(
            Tensor::full({count}, double(r + 100 * root), DType::kI32));
      }
    }
    Tensor part = Tensor::zeros({count}, DType::kI32);
    group.scatter(part, parts, {.root = root})->wait();
    for (std::int64_t i = 0; i < count; ++i) {
      expect(data<std::int32_t>(part)[i] == rank + 100 * root,
             "scatter from " + std::to_string(root));
    }
  }
  group.barrier()->wait();
}

// Where the ranks run: rank r in namespace host_of[r] of `hosts`, or all
// on this host where `hosts` is null; the ranks listed in `tcp` with
// COMM_TRANSPORT=tcp. With `traffic`, the lowest rank of each namespace
// also measures what a large all_reduce sends to the other.
struct Layout {
  const NamespacePair* hosts = nullptr;
  std::vector<int> host_of;
  std::vector<int> tcp;
  bool traffic = false;
};

// Each rank's exit code and digests.
struct Ran {
  std::vector<int> codes;
  std::vector<std::map<std::string, std::string>> digests;
};

// A rank's process: enters namespace `host` of `hosts` (stays on this host
// where `hosts` is null) with COMM_TCP_ADDR set to its address, and runs
// `body`, whose return value is the exit code; what it throws is printed
// and becomes kWrongResult or kOtherError.
int run_rank(const NamespacePair* hosts, int host, int rank,
             const std::function<int()>& body) {
  if (hosts != nullptr) {
    if (!hosts->enter(host)) return 97;
    setenv("COMM_TCP_ADDR", NamespacePair::address(host).c_str(), 1);
  }
  try {
    return body();
  } catch (const WrongResult& e) {
    std::fprintf(stderr, "rank %d: wrong result: %s\n", rank, e.what());
    return kWrongResult;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return kOtherError;
  }
}

// Runs the ranks, each checking every collective and writing its digests
// to a file.
Ran run(const Layout& layout) {
  const std::vector<int>& host_of = layout.host_of;
  const NamespacePair* hosts = layout.hosts;
  const bool traffic = layout.traffic;
  const int world = static_cast<int>(host_of.size());
  const std::string url =
      (hosts != nullptr
           ? "tcp://" + NamespacePair::address(host_of[0]) + ":29531"
           : "tcp://127.0.0.1:" +
                 std::to_string(comm::detail::free_loopback_port())) +
      "?world_size=" + std::to_string(world);
  std::vector<std::unique_ptr<TempPath>> files;
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    files.push_back(std::make_unique<TempPath>("libcomm_hierarchy"));
    const std::string path = files.back()->str();
    const int host = host_of[rank];
    bool first_of_host = true;
    for (int r = 0; r < rank; ++r) first_of_host &= host_of[r] != host;
    const bool tcp = std::find(layout.tcp.begin(), layout.tcp.end(), rank) !=
                     layout.tcp.end();
    ranks.push_back(std::make_unique<ChildProcess>([=] {
      return run_rank(hosts, host, rank, [&] {
        setenv("COMM_TRANSPORT", tcp ? "tcp" : "auto", 1);
        auto group = comm::init_process_group("tcp", url, rank, world, 60s);
        std::ofstream digests(path);
        check_collectives(*group, digests);
        digests.close();
        if (!traffic) return 0;
        // 4 MiB: each host's ranks send their host's reduction of one half
        // across, once: 4 MiB each way in all, and the TCP/IP headers.
        const std::int64_t count = 1 << 20;
        const double bytes = 4.0 * count;
        Tensor t = Tensor::full({count}, 1.0, DType::kF32);
        group->barrier()->wait();
        const std::uint64_t before =
            first_of_host ? hosts->bytes_sent(host) : 0;
        group->barrier()->wait();
        group->all_reduce(t)->wait();
        group->barrier()->wait();
        if (!first_of_host) return 0;
        const double sent = double(hosts->bytes_sent(host) - before);
        std::fprintf(stderr,
                     "rank %d: host %d sent %.0f bytes to the other host in "
                     "an all_reduce of %.0f bytes\n",
                     rank, host, sent, bytes);
        return sent <= 1.25 * bytes ? 0 : kTooMuchTraffic;
      });
    }));
  }
  Ran ran;
  for (auto& r : ranks) ran.codes.push_back(r->wait(240s));
  for (auto& file : files) {
    std::map<std::string, std::string> lines;
    std::ifstream in(file->str());
    std::string line;
    while (std::getline(in, line)) {
      const auto space = line.rfind(' ');
      lines[line.substr(0, space)] = line.substr(space + 1);
    }
    ran.digests.push_back(std::move(lines));
  }
  return ran;
}

void check_ran(const Ran& ran) {
  const int world = static_cast<int>(ran.codes.size());
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(ran.codes[rank] == 0);
  }
  // Every rank noted every shared result, with the same bits.
  REQUIRE_FALSE(ran.digests[0].empty());
  for (int rank = 1; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(ran.digests[rank] == ran.digests[0]);
  }
}

}  // namespace

TEST_CASE("two hosts of two ranks: every collective, the same bits everywhere",
          "[hierarchy][multiproc][hosts]") {
  NamespacePair hosts;
  if (!hosts.ok()) {
    WARN("SKIPPED: " << hosts.why());
    return;
  }
  SECTION("the hosts' ranks alternate, and the link carries each share once") {
    check_ran(run({.hosts = &hosts, .host_of = {0, 1, 0, 1}, .traffic = true}));
  }
  SECTION("the hosts' ranks in rank order") {
    check_ran(run({.hosts = &hosts, .host_of = {0, 0, 1, 1}}));
  }
}

// Ranks that name different roots of a small scatter across hosts (its
// tree over the ranks ordered from the root's host on) must not return
// success with data their root did not send, nor wait for the timeout:
// each fails with MismatchError in the scatter, or, if its own part came
// from ranks that agree with it, in one of the barriers after it, within
// the confirmation window. Ranks 0 and 1 name rank 0, ranks 2 and 3 rank
// 2: each half's tree reaches into the other host.
TEST_CASE("ranks that name different roots of a scatter across hosts fail",
          "[hierarchy][multiproc][hosts][mismatch]") {
  NamespacePair hosts;
  if (!hosts.ok()) {
    WARN("SKIPPED: " << hosts.why());
    return;
  }
  constexpr int kNoMismatch = 25;
  constexpr int world = 4;
  const std::vector<int> host_of{0, 0, 1, 1};
  const std::string url = "tcp://" + NamespacePair::address(0) +
                          ":29532?world_size=" + std::to_string(world);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=, &hosts] {
      return run_rank(&hosts, host_of[rank], rank, [&] {
        const int root = rank < 2 ? 0 : 2;
        try {
          auto group = comm::init_process_group("tcp", url, rank, world, 60s);
          const std::int64_t count = 16;
          Tensor part = Tensor::full({count}, -1.0, DType::kI32);
          std::vector<Tensor> parts;
          for (int r = 0; rank == root && r < world; ++r) {
            parts.push_back(Tensor::full({count}, r + 100 * root, DType::kI32));
          }
          group->scatter(part, parts, {.root = root})->wait();
          for (std::int64_t i = 0; i < count; ++i) {
            expect(data<std::int32_t>(part)[i] == rank + 100 * root,
                   "scatter from " + std::to_string(root));
          }
          for (std::uint64_t b = 0; b <= 256; ++b) {
            group->barrier({.timeout = 5s})->wait();
          }
          std::fprintf(stderr, "rank %d: no MismatchError\n", rank);
          return kNoMismatch;
        } catch (const comm::MismatchError& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          return 0;
        }
      });
    }));
  }
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(ranks[rank]->wait(60s) == 0);
  }
}

// Rank 3 of two hosts of two ranks dies right after it publishes its
// address (its local peer, rank 2, waits for its connection; ranks 0 and
// 1, on the other host, too) or its arrival at the set-up's last barrier.
// Rank 2 finds the death through rank 3's pidfd, and ranks 0 and 1 learn
// it from the barrier, or from rank 3's connections hanging up: each
// names rank 3 within seconds, not at the set-up's deadline.
TEST_CASE(
    "a rank killed during the set-up of a group across hosts is named by "
    "every rank within 5 s",
    "[hierarchy][multiproc][hosts][failure]") {
  NamespacePair hosts;
  if (!hosts.ok()) {
    WARN("SKIPPED: " << hosts.why());
    return;
  }
  const char* fatal_key = GENERATE("tcp/addr/3", "tcp/connected/rank/3");
  INFO("rank 3 dies after setting " << fatal_key);
  constexpr int world = 4, victim = 3;
  const std::vector<int> host_of{0, 0, 1, 1};
  // Rank 0's namespace is fresh: any port is free there.
  const auto port = static_cast<std::uint16_t>(29533);
  comm::testing::RankProcesses ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=, &hosts] {
      if (!hosts.enter(host_of[rank])) return 97;
      setenv("COMM_TCP_ADDR", NamespacePair::address(host_of[rank]).c_str(), 1);
      try {
        auto store = comm::testing::kept_rank_store(rank, port,
                                                    NamespacePair::address(0));
        if (rank == victim) {
          store =
              std::make_shared<comm::testing::DyingStore>(*store, fatal_key);
        }
        comm::ProcessGroup group(store, rank, world, "tcp", 60s);
        return 1;  // a group without rank 3
      } catch (...) {
        return comm::testing::failure_exit_code(std::current_exception(), rank,
                                                victim);
      }
    }));
  }
  REQUIRE(ranks[victim]->wait(60s) == 128 + SIGKILL);
  const auto died = std::chrono::steady_clock::now();
  CHECK(comm::testing::check_exit_codes(ranks, victim,
                                        comm::testing::kPeerErrorNamingVictim,
                                        60s, died) < 5.5);
}

TEST_CASE("uneven hosts, three ranks and one: every collective, the same bits",
          "[hierarchy][multiproc][hosts]") {
  NamespacePair hosts;
  if (!hosts.ok()) {
    WARN("SKIPPED: " << hosts.why());
    return;
  }
  check_ran(run({.hosts = &hosts, .host_of = {0, 1, 0, 0}}));
}

TEST_CASE(
    "a rank that asks for tcp is a host of its own: every collective, the "
    "same bits",
    "[hierarchy][multiproc]") {
  // Four ranks on this host, rank 2 with COMM_TRANSPORT=tcp: the hosts are
  // {0,1,3} and {2}, which every rank must know alike, rank 2 included.
  check_ran(run({.host_of = {0, 0, 0, 0}, .tcp = {2}}));
}
