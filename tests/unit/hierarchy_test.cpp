// The hierarchical collectives and their pieces: HostPartition,
// SubgroupTransport, the partition the local peers publish, and the
// algorithms' phases over groups spanning hosts.
//
// The hosts here are made up: ranks are threads of one process, each with
// its own Mesh, and the test's transport hands the algorithms the
// partition of its choice, as the backend's hands them the one its ranks
// published. Which link a pair uses does not change what an algorithm
// sends, so a made-up partition runs the phases real hosts would; the
// transport counts the bytes each rank sends to each peer, which shows the
// phases: what crosses from one made-up host to another.
// tests/multiproc/hierarchy_test.cpp runs them over real hosts (network
// namespaces).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "backends/host_partition.h"
#include "backends/shm/local_peers.h"
#include "backends/subgroup_transport.h"
#include "backends/tcp/algorithms.h"
#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "libcomm/error.h"
#include "support/mesh_ranks.h"
#include "support/rank_checks.h"

using comm::CollectiveStep;
using comm::CollectiveTransport;
using comm::DType;
using comm::HostPartition;
using comm::ReduceOp;
using comm::SubgroupTransport;
using comm::tcp::CallInfo;
using comm::tcp::Collective;
using comm::tcp::Exchange;
using comm::tcp::Mesh;
using comm::testing::check_all_ok;
using comm::testing::expect;
using comm::testing::run_meshes;
using namespace std::chrono_literals;
namespace alg = comm::tcp::algorithms;

namespace {

// Exchanges over a Mesh for one call, with the hosts it is given, counting
// the payload bytes this rank sends to each peer.
class CountingTransport final : public CollectiveTransport {
 public:
  CountingTransport(Mesh& mesh, const CallInfo& call,
                    const HostPartition* hosts)
      : mesh_(mesh),
        call_(call),
        hosts_(hosts),
        deadline_(comm::detail::deadline_after(30s)),
        sent_(static_cast<std::size_t>(mesh.size())),
        step_(sent_) {}

  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  CollectiveStep& step() override {
    exchange_.emplace(mesh_, call_, deadline_, -1);
    step_.inner = &*exchange_;
    return step_;
  }
  const HostPartition* hosts() const override { return hosts_; }
  std::string describe() const override { return call_.describe(); }

  // The payload bytes sent to each peer.
  const std::vector<std::uint64_t>& sent() const { return sent_; }
  // The payload bytes sent to ranks of other hosts than this rank's.
  std::uint64_t sent_across() const {
    std::uint64_t total = 0;
    for (int peer = 0; peer < size(); ++peer) {
      if (hosts_->host_of(peer) != hosts_->host_of(rank())) {
        total += sent_[peer];
      }
    }
    return total;
  }

 private:
  // The Exchange, counting what its sends and relays carry.
  class Counting final : public CollectiveStep {
   public:
    explicit Counting(std::vector<std::uint64_t>& sent) : sent_(sent) {}
    void send(int peer, const void* data, std::size_t bytes) override {
      sent_[peer] += bytes;
      inner->send(peer, data, bytes);
    }
    void recv(int peer, void* data, std::size_t bytes) override {
      inner->recv(peer, data, bytes);
    }
    void send_address(int peer, const void* data, std::size_t bytes) override {
      sent_[peer] += bytes;
      inner->send_address(peer, data, bytes);
    }
    void recv_address(int peer, void* data, std::size_t bytes) override {
      inner->recv_address(peer, data, bytes);
    }
    void recv_reduce(int peer, void* data, std::size_t bytes, DType dtype,
                     ReduceOp op, const void* base = nullptr) override {
      inner->recv_reduce(peer, data, bytes, dtype, op, base);
    }
    int recv_parts(int peer, std::span<const Part> parts, DType dtype,
                   ReduceOp op) override {
      return inner->recv_parts(peer, parts, dtype, op);
    }
    void relay(int peer, std::span<const Part> parts, std::size_t ready,
               int source) override {
      for (const Part& part : parts) sent_[peer] += part.bytes;
      inner->relay(peer, parts, ready, source);
    }
    void send_confirmation(int peer) override {
      inner->send_confirmation(peer);
    }
    void expect_confirmation(int peer) override {
      inner->expect_confirmation(peer);
    }
    void send_owed_confirmations() override {
      inner->send_owed_confirmations();
    }
    void run() override { inner->run(); }

    CollectiveStep* inner = nullptr;

   private:
    std::vector<std::uint64_t>& sent_;
  };

  Mesh& mesh_;
  const CallInfo call_;
  const HostPartition* hosts_;
  const comm::detail::Clock::time_point deadline_;
  std::optional<Exchange> exchange_;
  std::vector<std::uint64_t> sent_;
  Counting step_;
};

// Data whose sums round differently in different orders.
float inexact(int rank, std::size_t i) {
  return 1.0f / static_cast<float>(1 + (rank * 7 + i) % 29) +
         static_cast<float>(rank) * 1e-3f;
}

std::vector<std::uint8_t> bytes_of(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  return {p, p + bytes};
}

// What one rank finished a call with: the result's bytes, and the payload
// bytes it sent to other hosts.
struct Outcome {
  std::string name;
  std::vector<std::uint8_t> result;
  std::uint64_t sent_across = 0;
};

}  // namespace

TEST_CASE("a host partition numbers hosts by their lowest rank",
          "[hierarchy]") {
  const HostPartition interleaved({7, 5, 7, 5, 9});
  CHECK(interleaved.size() == 5);
  CHECK(interleaved.host_count() == 3);
  CHECK(interleaved.ranks_of(0) == std::vector<int>{0, 2});
  CHECK(interleaved.ranks_of(1) == std::vector<int>{1, 3});
  CHECK(interleaved.ranks_of(2) == std::vector<int>{4});
  CHECK(interleaved.host_of(3) == 1);
  CHECK(interleaved.local_index(3) == 1);
  CHECK(interleaved.local_index(4) == 0);
  CHECK(interleaved.host_order() == std::vector<int>{0, 2, 1, 3, 4});
  CHECK_FALSE(interleaved.even());
  CHECK(interleaved.hierarchical());
  CHECK(interleaved.describe() == "{0,2} {1,3} {4}");
  // The labels' values do not matter, only which are equal.
  CHECK(HostPartition({1, 2, 1, 2, 3}) == interleaved);

  const HostPartition even({0, 1, 0, 1});
  CHECK(even.even());
  CHECK(even.hierarchical());

  const HostPartition singletons(4);
  CHECK(singletons.host_count() == 4);
  CHECK(singletons.even());
  CHECK_FALSE(singletons.hierarchical());
  CHECK(singletons.host_order() == std::vector<int>{0, 1, 2, 3});

  const HostPartition one_host({3, 3, 3});
  CHECK(one_host.host_count() == 1);
  CHECK_FALSE(one_host.hierarchical());
  CHECK_THROWS_AS(HostPartition(-1), comm::InvalidArgument);
}

TEST_CASE("the local peers publish the same partition on every rank",
          "[hierarchy]") {
  // Threads of one process share a host: one host, or with
  // COMM_TRANSPORT=tcp (the _over_tcp run) every rank a host of its own.
  const int world = 4;
  std::vector<std::string> seen(world);
  auto errors = run_meshes(world, 30s, [&](Mesh& mesh) {
    const HostPartition& hosts = mesh.local_peers().hosts();
    seen[mesh.rank()] = hosts.describe();
    const bool shared = mesh.local_peers().local_count() > 1;
    expect(hosts == (shared ? HostPartition({0, 0, 0, 0}) : HostPartition(4)),
           "rank " + std::to_string(mesh.rank()) + " sees " + hosts.describe());
    if (comm::shm::transport_choice() == comm::shm::Transport::kTcp) {
      expect(!shared, "COMM_TRANSPORT=tcp and yet local peers");
    }
  });
  check_all_ok(errors);
  for (int r = 1; r < world; ++r) CHECK(seen[r] == seen[0]);
}

TEST_CASE("a subgroup view refuses ranks it cannot translate", "[hierarchy]") {
  auto errors = run_meshes(1, 30s, [&](Mesh& mesh) {
    const CallInfo call{Collective::kBarrier, 0, DType::kU8, 0,
                        ReduceOp::kSum,       -1};
    CountingTransport whole(mesh, call, nullptr);
    auto refused = [&](std::vector<int> members) {
      try {
        SubgroupTransport view(whole, std::move(members));
      } catch (const comm::InvalidArgument&) {
        return true;
      }
      return false;
    };
    expect(refused({}), "no members");
    expect(refused({0, 0}), "a member twice");
    expect(refused({0, 1}), "a rank beyond the group");
    expect(refused({-1, 0}), "a negative rank");
    SubgroupTransport alone(whole, {0});
    expect(alone.rank() == 0 && alone.size() == 1, "a view of one rank");
  });
  check_all_ok(errors);
}

TEST_CASE("a subgroup view runs an algorithm among its members, in its order",
          "[hierarchy]") {
  // Ranks 3, 0 and 2 of 4 run a ring all_gather in that order; rank 1
  // takes no part. Each member sends only to the next in the view's order.
  const int world = 4;
  const std::vector<int> members{3, 0, 2};
  const std::size_t bytes = 100003;  // past the direct exchange: a ring
  std::vector<std::vector<std::uint64_t>> sent(world);
  auto errors = run_meshes(world, 30s, [&](Mesh& mesh) {
    if (mesh.rank() == 1) return;
    const CallInfo call{
        Collective::kAllGather, 0, DType::kU8, static_cast<std::int64_t>(bytes),
        ReduceOp::kSum,         -1};
    CountingTransport whole(mesh, call, nullptr);
    SubgroupTransport view(whole, members);
    expect(view.member(view.rank()) == mesh.rank(), "own rank");
    std::vector<std::vector<std::uint8_t>> blocks(
        members.size(), std::vector<std::uint8_t>(bytes));
    std::vector<void*> pointers;
    for (auto& block : blocks) pointers.push_back(block.data());
    for (std::size_t i = 0; i < bytes; ++i) {
      blocks[view.rank()][i] = static_cast<std::uint8_t>(i * 7 + mesh.rank());
    }
    alg::all_gather(view, pointers, bytes);
    for (std::size_t m = 0; m < members.size(); ++m) {
      for (std::size_t i = 0; i < bytes; ++i) {
        expect(blocks[m][i] == static_cast<std::uint8_t>(i * 7 + members[m]),
               "block of rank " + std::to_string(members[m]));
      }
    }
    sent[mesh.rank()] = whole.sent();
  });
  check_all_ok(errors);
  for (std::size_t m = 0; m < members.size(); ++m) {
    const int from = members[m];
    const int to = members[(m + 1) % members.size()];
    for (int peer = 0; peer < world; ++peer) {
      INFO("rank " << from << " to rank " << peer);
      CHECK(sent[from][peer] ==
            (peer == to ? (members.size() - 1) * bytes : 0));
    }
  }
}

TEST_CASE("a subgroup view's messages carry the call: a mismatch is seen",
          "[hierarchy]") {
  auto errors = run_meshes(3, 30s, [&](Mesh& mesh) {
    if (mesh.rank() == 1) return;
    // Ranks 2 and 0 reduce through a view, naming different counts.
    const std::int64_t count = mesh.rank() == 0 ? 8 : 9;
    const CallInfo call{Collective::kAllReduce, 4, DType::kF32, count,
                        ReduceOp::kSum,         -1};
    CountingTransport whole(mesh, call, nullptr);
    SubgroupTransport view(whole, {2, 0});
    std::vector<float> data(static_cast<std::size_t>(count), 1.0f);
    try {
      alg::all_reduce(view, data.data(), data.data(), data.size(), DType::kF32,
                      ReduceOp::kSum);
    } catch (const comm::MismatchError& e) {
      const std::string what = e.what();
      const std::string other = mesh.rank() == 0 ? "rank 2" : "rank 0";
      expect(what.find("x 8") != std::string::npos &&
                 what.find("x 9") != std::string::npos &&
                 what.find(other) != std::string::npos,
             "the error names one count only, or not the peer: " + what);
      return;
    }
    throw std::runtime_error("no MismatchError");
  });
  check_all_ok(errors);
}

namespace {

// Runs every collective whose algorithm depends on the hosts over a group
// of labels.size() ranks split into hosts by `labels`, and returns each
// rank's outcomes, in the same order on every rank.
std::vector<std::vector<Outcome>> run_over_hosts(
    const std::vector<int>& labels, std::vector<std::string>& errors) {
  const int world = static_cast<int>(labels.size());
  const HostPartition hosts(labels);
  std::vector<std::vector<Outcome>> outcomes(world);
  errors = run_meshes(world, 60s, [&](Mesh& mesh) {
    const int rank = mesh.rank();
    std::uint64_t sequence = 0;
    auto transport = [&](Collective collective, DType dtype, std::int64_t count,
                         ReduceOp op, int root) {
      return CountingTransport(
          mesh, CallInfo{collective, sequence++, dtype, count, op, root},
          &hosts);
    };
    auto record = [&](std::string name, const void* data, std::size_t bytes,
                      const CountingTransport& ctx) {
      outcomes[rank].push_back(
          {std::move(name), bytes_of(data, bytes), ctx.sent_across()});
    };
    // all_reduce: small (leaders), large (the three phases, or the ring in
    // host order), in place and out of place; float sums that round by
    // order, exact integer maxima.
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1009},
          std::size_t{16384}, std::size_t{40009}, std::size_t{262147}}) {
      for (bool in_place : {true, false}) {
        std::vector<float> input(count), output(count, -7.0f);
        for (std::size_t i = 0; i < count; ++i) input[i] = inexact(rank, i);
        float* out = in_place ? input.data() : output.data();
        CountingTransport ctx =
            transport(Collective::kAllReduce, DType::kF32,
                      static_cast<std::int64_t>(count), ReduceOp::kSum, -1);
        alg::all_reduce(ctx, input.data(), out, count, DType::kF32,
                        ReduceOp::kSum);
        record("all_reduce sum " + std::to_string(count) +
                   (in_place ? " in place" : " out of place"),
               out, count * sizeof(float), ctx);
        if (!in_place) {
          for (std::size_t i = 0; i < count; ++i) {
            expect(input[i] == inexact(rank, i), "the input was written");
          }
        }
      }
    }
    for (std::size_t count : {std::size_t{3}, std::size_t{100003}}) {
      std::vector<std::int32_t> data(count);
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = static_cast<std::int32_t>((rank * 13 + i) % 17) - 8;
      }
      CountingTransport ctx =
          transport(Collective::kAllReduce, DType::kI32,
                    static_cast<std::int64_t>(count), ReduceOp::kMax, -1);
      alg::all_reduce(ctx, data.data(), data.data(), count, DType::kI32,
                      ReduceOp::kMax);
      record("all_reduce max " + std::to_string(count), data.data(),
             count * sizeof(std::int32_t), ctx);
    }
    // broadcast and reduce from every root.
    for (int root = 0; root < world; ++root) {
      for (std::size_t bytes : {std::size_t{1}, std::size_t{100003}}) {
        std::vector<std::uint8_t> data(bytes);
        for (std::size_t i = 0; i < bytes; ++i) {
          data[i] = static_cast<std::uint8_t>(rank == root ? i * 3 + root : 0);
        }
        CountingTransport ctx =
            transport(Collective::kBroadcast, DType::kU8,
                      static_cast<std::int64_t>(bytes), ReduceOp::kSum, root);
        alg::broadcast(ctx, data.data(), bytes, root);
        record("broadcast " + std::to_string(bytes) + " from " +
                   std::to_string(root),
               data.data(), bytes, ctx);
      }
      for (std::size_t count : {std::size_t{1}, std::size_t{30011}}) {
        std::vector<std::int64_t> data(count);
        for (std::size_t i = 0; i < count; ++i) {
          data[i] = static_cast<std::int64_t>(rank + 1) * (1000 + i);
        }
        CountingTransport ctx =
            transport(Collective::kReduce, DType::kI64,
                      static_cast<std::int64_t>(count), ReduceOp::kSum, root);
        alg::reduce(ctx, data.data(), count, DType::kI64, ReduceOp::kSum, root);
        record(
            "reduce " + std::to_string(count) + " to " + std::to_string(root),
            rank == root ? data.data() : nullptr,
            rank == root ? count * sizeof(std::int64_t) : 0, ctx);
      }
    }
    // scatter and gather from every root: parts of 3 bytes (scatter's tree
    // across hosts) and of 70001 (straight from the root: at least 256
    // KiB in all from four ranks on).
    for (int root = 0; root < world; ++root) {
      for (std::size_t bytes : {std::size_t{3}, std::size_t{70001}}) {
        std::vector<std::uint8_t> parts(rank == root ? bytes * world : 0);
        std::vector<const void*> inputs;
        for (int r = 0; rank == root && r < world; ++r) {
          for (std::size_t i = 0; i < bytes; ++i) {
            parts[bytes * r + i] = static_cast<std::uint8_t>(i * 5 + r + root);
          }
          inputs.push_back(&parts[bytes * r]);
        }
        std::vector<std::uint8_t> part(bytes);
        CountingTransport scatter =
            transport(Collective::kScatter, DType::kU8,
                      static_cast<std::int64_t>(bytes), ReduceOp::kSum, root);
        alg::scatter(scatter, inputs, part.data(), bytes, root);
        record("scatter " + std::to_string(bytes) + " from " +
                   std::to_string(root),
               part.data(), bytes, scatter);

        std::vector<std::uint8_t> block(bytes);
        for (std::size_t i = 0; i < bytes; ++i) {
          block[i] = static_cast<std::uint8_t>(i * 3 + rank * 11 + root);
        }
        std::vector<std::uint8_t> blocks(rank == root ? bytes * world : 0);
        std::vector<void*> outputs;
        for (int r = 0; rank == root && r < world; ++r) {
          outputs.push_back(&blocks[bytes * r]);
        }
        CountingTransport gather =
            transport(Collective::kGather, DType::kU8,
                      static_cast<std::int64_t>(bytes), ReduceOp::kSum, root);
        alg::gather(gather, block.data(), outputs, bytes, root);
        record(
            "gather " + std::to_string(bytes) + " to " + std::to_string(root),
            blocks.data(), blocks.size(), gather);
      }
    }
    // all_gather and reduce_scatter: direct, and rings in host order.
    for (std::size_t count : {std::size_t{1}, std::size_t{20011}}) {
      const std::size_t bytes = count * sizeof(std::int32_t);
      std::vector<std::int32_t> all(count * world);
      std::vector<void*> blocks;
      for (int r = 0; r < world; ++r) blocks.push_back(&all[count * r]);
      for (std::size_t i = 0; i < count; ++i) {
        all[count * rank + i] = static_cast<std::int32_t>(rank * 100000 + i);
      }
      CountingTransport gather =
          transport(Collective::kAllGather, DType::kI32,
                    static_cast<std::int64_t>(count), ReduceOp::kSum, -1);
      alg::all_gather(gather, blocks, bytes);
      record("all_gather " + std::to_string(count), all.data(), bytes * world,
             gather);

      std::vector<std::int32_t> inputs(count * world), output(count);
      std::vector<const void*> input_blocks;
      for (int r = 0; r < world; ++r)
        input_blocks.push_back(&inputs[count * r]);
      for (std::size_t i = 0; i < count * world; ++i) {
        inputs[i] = static_cast<std::int32_t>(rank * 7 + i % 1013);
      }
      CountingTransport scatter =
          transport(Collective::kReduceScatter, DType::kI32,
                    static_cast<std::int64_t>(count), ReduceOp::kSum, -1);
      alg::reduce_scatter(scatter, input_blocks, output.data(), count,
                          DType::kI32, ReduceOp::kSum);
      record("reduce_scatter " + std::to_string(count), output.data(), bytes,
             scatter);
    }
  });
  return outcomes;
}

std::size_t count_in(const std::string& name, std::size_t word) {
  std::size_t at = 0;
  for (std::size_t w = 0; w < word; ++w) at = name.find(' ', at) + 1;
  return std::stoul(name.substr(at));
}

}  // namespace

TEST_CASE("hierarchical collectives over made-up hosts", "[hierarchy][sweep]") {
  const std::vector<std::vector<int>> partitions{
      {0, 0, 1, 1},        // two hosts of two, in rank order
      {0, 1, 0, 1},        // two hosts of two, interleaved
      {0, 0, 0, 1},        // three and one
      {0, 1, 1, 1},        // one and three
      {0, 1, 2, 0, 1, 2},  // three hosts of two, interleaved
      {0, 0, 0, 1, 1, 1},  // two hosts of three
      {0, 0, 1, 1, 2},     // two, two and one
      {0, 1, 0, 1, 0, 1, 0, 1},
  };
  for (const auto& labels : partitions) {
    const HostPartition hosts(labels);
    const int world = hosts.size();
    INFO("hosts " << hosts.describe());
    std::vector<std::string> errors;
    const auto outcomes = run_over_hosts(labels, errors);
    check_all_ok(errors);
    if (!std::all_of(errors.begin(), errors.end(),
                     [](const std::string& e) { return e.empty(); })) {
      continue;
    }
    const std::size_t calls = outcomes[0].size();
    for (int r = 1; r < world; ++r) REQUIRE(outcomes[r].size() == calls);
    for (std::size_t c = 0; c < calls; ++c) {
      const std::string& name = outcomes[0][c].name;
      INFO(name);
      std::uint64_t across = 0;
      for (int r = 0; r < world; ++r) across += outcomes[r][c].sent_across;
      const int H = hosts.host_count();
      if (name.starts_with("all_reduce")) {
        const bool is_sum = name.starts_with("all_reduce sum");
        const std::size_t count = count_in(name, 2);
        // Bitwise the same on every rank.
        for (int r = 1; r < world; ++r) {
          INFO("rank " << r);
          CHECK(outcomes[r][c].result == outcomes[0][c].result);
        }
        for (std::size_t i = 0; i < count; ++i) {
          if (is_sum) {
            float got;
            std::memcpy(&got, &outcomes[0][c].result[i * 4], 4);
            double expected = 0;
            for (int r = 0; r < world; ++r) expected += inexact(r, i);
            if (std::fabs(got - expected) > 1e-5 * std::fabs(expected)) {
              FAIL("element " << i << ": " << got << " for " << expected);
            }
          } else {
            std::int32_t got;
            std::memcpy(&got, &outcomes[0][c].result[i * 4], 4);
            std::int32_t expected = -1000;
            for (int r = 0; r < world; ++r) {
              expected = std::max(
                  expected, static_cast<std::int32_t>((r * 13 + i) % 17) - 8);
            }
            if (got != expected) FAIL("element " << i);
          }
        }
        // Two hosts, large sums over even hosts: each rank sends its
        // host's reduction of one segment across, once (one exchange, or
        // a ring of two), and nothing else.
        const std::size_t bytes = count * 4;
        if (is_sum && H == 2 && hosts.even() &&
            bytes > alg::ring_threshold_bytes(world)) {
          for (int r = 0; r < world; ++r) {
            const auto L = static_cast<std::size_t>(world / H);
            const std::size_t held = (hosts.local_index(r) + 1) % L;
            const std::size_t segment = count / L + (held < count % L ? 1 : 0);
            INFO("rank " << r);
            CHECK(outcomes[r][c].sent_across == segment * 4);
          }
        }
        // Small sums: only the leaders send across, the message once per
        // round among them.
        if (is_sum && H == 2 && bytes <= alg::ring_threshold_bytes(world) &&
            count > 0) {
          for (int r = 0; r < world; ++r) {
            INFO("rank " << r);
            CHECK(outcomes[r][c].sent_across ==
                  (hosts.local_index(r) == 0 ? bytes : 0));
          }
        }
      } else if (name.starts_with("broadcast")) {
        const std::size_t bytes = count_in(name, 1);
        const int root = static_cast<int>(count_in(name, 3));
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < bytes; ++i) {
            if (outcomes[r][c].result[i] !=
                static_cast<std::uint8_t>(i * 3 + root)) {
              FAIL("rank " << r << " byte " << i);
            }
          }
        }
        // Each host but the root's receives the message once.
        CHECK(across == bytes * static_cast<std::size_t>(H - 1));
      } else if (name.starts_with("scatter") || name.starts_with("gather")) {
        const std::size_t bytes = count_in(name, 1);
        const int root = static_cast<int>(count_in(name, 3));
        const bool scatter = name.starts_with("scatter");
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < bytes; ++i) {
            const std::uint8_t got =
                scatter ? outcomes[r][c].result[i]
                        : outcomes[root][c].result[bytes * r + i];
            if (got != static_cast<std::uint8_t>(scatter
                                                     ? i * 5 + r + root
                                                     : i * 3 + r * 11 + root)) {
              FAIL("rank " << r << " byte " << i);
            }
          }
        }
        // Each part of a rank off the root's host crosses the network, and
        // with two hosts only once, through the tree too.
        std::size_t off_host = 0;
        for (int r = 0; r < world; ++r) {
          if (hosts.host_of(r) != hosts.host_of(root)) off_host += bytes;
        }
        if (H == 2 || bytes > 3 || !scatter) {
          CHECK(across == off_host);
        } else {
          CHECK(across >= off_host);
        }
        // A small scatter's tree has the root's host's other ranks send
        // some of the parts across: the root sends fewer than all of them.
        if (scatter && bytes == 3 &&
            hosts.ranks_of(hosts.host_of(root)).size() > 1) {
          CHECK(outcomes[root][c].sent_across < off_host);
        }
      } else if (name.starts_with("reduce_scatter")) {
        const std::size_t count = count_in(name, 1);
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < count; ++i) {
            std::int32_t got;
            std::memcpy(&got, &outcomes[r][c].result[i * 4], 4);
            std::int64_t expected = 0;
            for (int q = 0; q < world; ++q) {
              expected += q * 7 + (count * r + i) % 1013;
            }
            if (got != expected) FAIL("rank " << r << " element " << i);
          }
        }
        // A ring in host order crosses each boundary between hosts once.
        if (count * 4 * (world - 1) > 65536) {
          CHECK(across == count * 4 * static_cast<std::size_t>(world - 1) *
                              static_cast<std::size_t>(H));
        }
      } else if (name.starts_with("reduce")) {
        const std::size_t count = count_in(name, 1);
        const int root = static_cast<int>(count_in(name, 3));
        for (std::size_t i = 0; i < count; ++i) {
          std::int64_t got;
          std::memcpy(&got, &outcomes[root][c].result[i * 8], 8);
          const std::int64_t expected = static_cast<std::int64_t>(world) *
                                        (world + 1) / 2 *
                                        static_cast<std::int64_t>(1000 + i);
          if (got != expected) FAIL("element " << i);
        }
        // Each host but the root's sends its share once.
        CHECK(across == count * 8 * static_cast<std::size_t>(H - 1));
      } else if (name.starts_with("all_gather")) {
        const std::size_t count = count_in(name, 1);
        for (int r = 0; r < world; ++r) {
          CHECK(outcomes[r][c].result == outcomes[0][c].result);
        }
        for (int q = 0; q < world; ++q) {
          for (std::size_t i = 0; i < count; ++i) {
            std::int32_t got;
            std::memcpy(&got, &outcomes[0][c].result[(count * q + i) * 4], 4);
            if (got != static_cast<std::int32_t>(q * 100000 + i)) {
              FAIL("block " << q << " element " << i);
            }
          }
        }
        if (count * 4 * (world - 1) > 65536) {
          CHECK(across == count * 4 * static_cast<std::size_t>(world - 1) *
                              static_cast<std::size_t>(H));
        }
      }
    }
  }
}
