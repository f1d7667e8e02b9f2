// The single-copy algorithms (backends/tcp/single_copy.h), run on meshes
// whose ranks are threads of this process, so that every rank is local and
// reads the others' memory with process_vm_readv. Each collective is run
// through a transport that counts what the ranks read of each other's
// memory, so that the tests see the direct path taken, and each byte read
// once, above the threshold, and nothing read below it. Results are checked
// against the scalar references of support/reference.h, folded in rank
// order 0..n-1 (as the algorithms reduce), with values whose reductions
// round, so that another order would give other bits; every rank's result
// is compared with the same reference, so every rank holds the same bits.
// Sizes that ranks disagree on are a MismatchError before anything is
// read, and a rank that leaves a call makes its readers fail.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/collective_context.h"
#include "backends/tcp/control_channel.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/single_copy.h"
#include "libcomm/detail/dispatch.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "libcomm/param.h"
#include "libcomm/shared_host_memory.h"
#include "support/env_is.h"
#include "support/mesh_ranks.h"
#include "support/rank_checks.h"
#include "support/reference.h"
#include "support/shared_host_mappings.h"
#include "support/thread_ranks.h"

using comm::CollectiveStep;
using comm::CollectiveTransport;
using comm::DType;
using comm::PeerMemory;
using comm::ReduceOp;
using comm::tcp::CallInfo;
using comm::tcp::Collective;
using comm::tcp::Mesh;
using comm::testing::EnvIs;
using comm::testing::expect;
using comm::testing::shared_host_mappings;
using Bytes = std::vector<std::uint8_t>;
namespace alg = comm::tcp::algorithms;
using namespace std::chrono_literals;

namespace {

// The offers of memory (PeerMemory::offer) that the ranks of the test
// running made, for the tests that check which ranks took a single-copy
// path.
std::atomic<std::size_t> offers_made{0};

// A rank's transport for one call, which counts the bytes its rank reads
// of the others' memory, and its offers in offers_made.
class Counted final : public CollectiveTransport, public PeerMemory {
 public:
  Counted(CollectiveTransport& inner, std::atomic<std::size_t>& read,
          bool hide_memory)
      : inner_(inner), read_(read), hide_memory_(hide_memory) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  CollectiveStep& step() override { return inner_.step(); }
  PeerMemory* peer_memory() override {
    if (hide_memory_) return nullptr;
    memory_ = inner_.peer_memory();
    return memory_ != nullptr ? this : nullptr;
  }
  std::string describe() const override { return inner_.describe(); }
  void offer() override {
    ++offers_made;
    memory_->offer();
  }
  void withdraw() override { memory_->withdraw(); }
  void read(int peer, const comm::PeerRegion& region, std::uint64_t offset,
            void* into, std::size_t bytes) override {
    read_ += bytes;
    memory_->read(peer, region, offset, into, bytes);
  }
  const std::uint8_t* mapped(int peer,
                             const comm::PeerRegion& region) override {
    const std::uint8_t* data = memory_->mapped(peer, region);
    if (data != nullptr) read_ += region.bytes;
    return data;
  }
  void confirm(std::span<const int> peers) override { memory_->confirm(peers); }
  bool kernel_copy_keeps_up() const override {
    return memory_->kernel_copy_keeps_up();
  }
  std::uint8_t* scratch(std::size_t bytes) override {
    return memory_->scratch(bytes);
  }

 private:
  CollectiveTransport& inner_;
  std::atomic<std::size_t>& read_;
  // As a rank whose transport offers no peer memory: it runs the rings'
  // algorithms whatever its peers do.
  bool hide_memory_;
  PeerMemory* memory_ = nullptr;
};

// One rank of a test: its mesh, its control channel, and the calls it has
// made, so that every rank numbers its calls alike.
class Rank {
 public:
  Rank(Mesh& mesh, std::atomic<std::size_t>& read)
      : mesh_(mesh),
        control_(mesh, std::chrono::seconds(15), std::chrono::seconds(3)),
        read_(read) {}
  int rank() const { return mesh_.rank(); }
  int size() const { return mesh_.size(); }
  Mesh& mesh() { return mesh_; }
  // Each later call's timeout.
  void set_timeout(std::chrono::milliseconds limit) { limit_ = limit; }

  // Runs `algorithm` as the next call, whose header says `call` (its
  // sequence number is set here); with `hide_memory`, through a transport
  // that offers no peer memory.
  void run(CallInfo call,
           const std::function<void(CollectiveTransport&)>& algorithm,
           bool hide_memory = false) {
    call.sequence = sequence_++;
    const auto deadline = comm::detail::deadline_after(limit_);
    comm::tcp::CollectiveContext context(mesh_, control_, call, deadline, -1,
                                         workspace_);
    Counted counted(context, read_, hide_memory);
    algorithm(counted);
  }

 private:
  Mesh& mesh_;
  comm::tcp::ControlChannel control_;
  std::atomic<std::size_t>& read_;
  std::uint64_t sequence_ = 0;
  std::chrono::milliseconds limit_ = 30s;
  comm::Workspace workspace_{std::size_t{1} << 20};
};

// Runs body(rank) on `world` ranks; returns each rank's error ("" where it
// succeeded). `read` counts the bytes all ranks read of each other.
std::vector<std::string> run_ranks(int world, std::atomic<std::size_t>& read,
                                   const std::function<void(Rank&)>& body) {
  return comm::testing::run_meshes(world, 60s, [&](Mesh& mesh) {
    Rank rank(mesh, read);
    body(rank);
  });
}

void check_all_ok(const std::vector<std::string>& errors) {
  comm::testing::check_all_ok(errors);
}

bool valid(ReduceOp op, DType dtype) {
  if (comm::is_bitwise(op) && comm::is_floating(dtype)) return false;
  return !(op == ReduceOp::kAvg && dtype == DType::kBool);
}

// Rank `rank`'s operand of a call: floats whose sums and products round
// (so that the order of reduction shows in the bits), and whose products
// over eight ranks stay finite; integers of every bit; bools 0 and 1.
Bytes operand(int rank, std::size_t count, DType dtype, ReduceOp op,
              std::uint64_t salt) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(rank) * 1000003 + count * 31 +
                      salt);
  const bool product = op == ReduceOp::kProduct;
  std::uniform_real_distribution<double> real(product ? 0.5 : -100.0,
                                              product ? 1.7 : 100.0);
  Bytes bytes(count * comm::dtype_size(dtype));
  comm::detail::dispatch_dtype(dtype, [&]<typename T>() {
    for (std::size_t i = 0; i < count; ++i) {
      T value{};
      if constexpr (std::is_same_v<T, bool>) {
        value = rng() % 2 == 0;
      } else if constexpr (std::is_integral_v<T>) {
        value = static_cast<T>(rng());
      } else {
        value = comm::detail::from_double<T>(real(rng));
      }
      std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
    }
  });
  return bytes;
}

// op(a, b) for one element, as support/reference.h defines it.
template <typename T>
T reference_op(ReduceOp op, T a, T b) {
  using comm::testing::bf16_round;
  using comm::testing::bf16_value;
  using comm::testing::f16_round;
  using comm::testing::f16_value;
  using comm::testing::float_reference;
  if constexpr (std::is_same_v<T, comm::Float16>) {
    return comm::Float16::from_bits(f16_round(static_cast<float>(
        float_reference(op, f16_value(a.bits), f16_value(b.bits)))));
  } else if constexpr (std::is_same_v<T, comm::BFloat16>) {
    return comm::BFloat16::from_bits(bf16_round(static_cast<float>(
        float_reference(op, bf16_value(a.bits), bf16_value(b.bits)))));
  } else if constexpr (std::is_same_v<T, bool>) {
    return comm::testing::bool_reference(op, a, b);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(float_reference(op, a, b));
  } else {
    return comm::testing::int_reference(op, a, b);
  }
}

// op over `operands` in their order, element by element, rounding after
// each step as the kernels do.
Bytes fold(const std::vector<Bytes>& operands, std::size_t count, DType dtype,
           ReduceOp op) {
  Bytes result = operands[0];
  comm::detail::dispatch_dtype(dtype, [&]<typename T>() {
    for (std::size_t r = 1; r < operands.size(); ++r) {
      for (std::size_t i = 0; i < count; ++i) {
        T a, b;
        std::memcpy(&a, result.data() + i * sizeof(T), sizeof(T));
        std::memcpy(&b, operands[r].data() + i * sizeof(T), sizeof(T));
        const T c = reference_op(op, a, b);
        std::memcpy(result.data() + i * sizeof(T), &c, sizeof(T));
      }
    }
  });
  return result;
}

std::string describe(DType dtype, ReduceOp op, std::size_t count, int world) {
  return std::string(comm::dtype_name(dtype)) + " " + comm::reduce_op_name(op) +
         " x " + std::to_string(count) + ", world " + std::to_string(world);
}

// A byte pattern of rank `rank`'s block `block`.
Bytes pattern(int rank, int block, std::size_t bytes) {
  Bytes data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    data[i] = static_cast<std::uint8_t>(i * 13 + rank * 7 + block * 29 + 1);
  }
  return data;
}

// Runs one all_to_all on `rank` in which rank r sends rank p
// part_bytes(r, p) bytes of pattern(r + salt, p), and checks each part it
// receives; `what` names the call in a failure.
void all_to_all_once(Rank& rank,
                     const std::function<std::size_t(int, int)>& part_bytes,
                     int salt, const std::string& what) {
  const int me = rank.rank();
  std::vector<std::size_t> send_offsets, send_bytes, recv_offsets, recv_bytes;
  Bytes input, output;
  for (int p = 0; p < rank.size(); ++p) {
    send_offsets.push_back(input.size());
    send_bytes.push_back(part_bytes(me, p));
    const Bytes part = pattern(me + salt, p, part_bytes(me, p));
    input.insert(input.end(), part.begin(), part.end());
    recv_offsets.push_back(output.size());
    recv_bytes.push_back(part_bytes(p, me));
    output.resize(output.size() + part_bytes(p, me), 0);
  }
  rank.run({Collective::kAllToAll, 0, DType::kI32, 0, ReduceOp::kSum, -1},
           [&](CollectiveTransport& t) {
             alg::all_to_all(t, input.data(), send_offsets, send_bytes,
                             output.data(), recv_offsets, recv_bytes);
           });
  for (int p = 0; p < rank.size(); ++p) {
    const Bytes got(output.begin() + recv_offsets[p],
                    output.begin() + recv_offsets[p] + recv_bytes[p]);
    expect(got == pattern(p + salt, me, part_bytes(p, me)),
           what + ", part from rank " + std::to_string(p));
  }
}

}  // namespace

TEST_CASE("single copy is on where every rank is local, unless turned off",
          "[single_copy]") {
  SECTION("by default") {
    auto errors = comm::testing::run_meshes(3, 20s, [](Mesh& mesh) {
      expect(mesh.local_peers().single_copy(), "single copy is off");
    });
    check_all_ok(errors);
  }
  SECTION("COMM_SHM_SINGLE_COPY=0") {
    EnvIs off({{"COMM_SHM_SINGLE_COPY", "0"}});
    auto errors = comm::testing::run_meshes(3, 20s, [](Mesh& mesh) {
      expect(!mesh.local_peers().single_copy(), "single copy is on");
    });
    check_all_ok(errors);
  }
  SECTION("COMM_SHM_KERNEL_COPY says whether the kernel's copy keeps up") {
    for (const char* word : {"fast", "slow"}) {
      EnvIs said({{"COMM_SHM_KERNEL_COPY", word}});
      const bool fast = std::string(word) == "fast";
      auto errors = comm::testing::run_meshes(2, 20s, [&](Mesh& mesh) {
        expect(mesh.local_peers().single_copy(), "single copy is off");
        expect(mesh.local_peers().kernel_copy_keeps_up() == fast,
               std::string("the kernel's copy does not follow ") + word);
      });
      check_all_ok(errors);
    }
  }
  SECTION("COMM_TRANSPORT=tcp") {
    EnvIs tcp({{"COMM_TRANSPORT", "tcp"}});
    auto errors = comm::testing::run_meshes(2, 20s, [](Mesh& mesh) {
      expect(!mesh.local_peers().single_copy(), "single copy over TCP");
    });
    check_all_ok(errors);
  }
}

TEST_CASE(
    "all_reduce reads each slice once: every dtype and op, worlds 1 to 8, in "
    "and out of place, the references' bits on every rank; two ranks keep "
    "the rings",
    "[single_copy][all_reduce]") {
  // Chunks of 4 KiB, so that a slice spans several.
  EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
             {"COMM_TCP_CHUNK_BYTES", "4096"}});
  for (int world = 1; world <= 8; ++world) {
    std::atomic<std::size_t> read{0};
    std::size_t expected_read = 0;  // by every rank together
    std::vector<std::size_t> counts = {0, 1, 2, 13, 1009};
    if (world % 3 == 1) counts.push_back(65537);
    for (std::size_t count : counts) {
      for (DType dtype : comm::kAllDTypes) {
        for (ReduceOp op : comm::kAllReduceOps) {
          if (!valid(op, dtype)) continue;
          if (count == 65537 && dtype != DType::kF32 && dtype != DType::kF16 &&
              dtype != DType::kI64) {
            continue;
          }
          // Each rank reads the others' part of its slice, then the other
          // slices: 2 (n - 1) messages' worth in all.
          expected_read += 2 * static_cast<std::size_t>(world - 1) * count *
                           comm::dtype_size(dtype) * 2;
        }
      }
    }
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      const int me = rank.rank();
      for (std::size_t count : counts) {
        for (DType dtype : comm::kAllDTypes) {
          for (ReduceOp op : comm::kAllReduceOps) {
            if (!valid(op, dtype)) continue;
            if (count == 65537 && dtype != DType::kF32 &&
                dtype != DType::kF16 && dtype != DType::kI64) {
              continue;
            }
            std::vector<Bytes> operands;
            for (int r = 0; r < world; ++r) {
              operands.push_back(operand(r, count, dtype, op, 1));
            }
            const Bytes expected = fold(operands, count, dtype, op);
            const std::string what = describe(dtype, op, count, world);
            const CallInfo call{Collective::kAllReduce,           0,  dtype,
                                static_cast<std::int64_t>(count), op, -1};
            // In place.
            Bytes data = operands[me];
            rank.run(call, [&](CollectiveTransport& t) {
              alg::all_reduce(t, data.data(), data.data(), count, dtype, op);
            });
            expect(data == expected, "in place: " + what);
            // Out of place: the input stays as it was.
            const Bytes input = operands[me];
            Bytes output(input.size(), 0x5a);
            rank.run(call, [&](CollectiveTransport& t) {
              alg::all_reduce(t, input.data(), output.data(), count, dtype, op);
            });
            expect(output == expected, "out of place: " + what);
            expect(input == operands[me], "input changed: " + what);
          }
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
    CHECK(read.load() == (world > 2 ? expected_read : 0));
  }
}

TEST_CASE(
    "reduce_scatter and reduce read each block once, against the "
    "references; a reduce_scatter of two ranks keeps the rings",
    "[single_copy][reduce_scatter][reduce]") {
  EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES", "1"},
             {"COMM_TCP_CHUNK_BYTES", "4096"}});
  const std::vector<std::pair<DType, ReduceOp>> cases = {
      {DType::kF32, ReduceOp::kSum},      {DType::kF16, ReduceOp::kSum},
      {DType::kBF16, ReduceOp::kProduct}, {DType::kF64, ReduceOp::kMax},
      {DType::kI32, ReduceOp::kBxor},     {DType::kU8, ReduceOp::kMin},
      {DType::kBool, ReduceOp::kBor}};
  for (int world : {1, 2, 3, 5, 8}) {
    std::atomic<std::size_t> read{0};
    std::size_t expected_read = 0;
    const std::vector<std::size_t> counts = {0, 1, 13, 4099};
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      const int me = rank.rank();
      std::size_t mine_expected = 0;
      for (std::size_t count : counts) {
        for (const auto& [dtype, op] : cases) {
          const std::size_t bytes = count * comm::dtype_size(dtype);
          const std::string what = describe(dtype, op, count, world);
          // reduce_scatter: rank r's block q is operand(r * world + q).
          std::vector<Bytes> blocks;
          for (int q = 0; q < world; ++q) {
            blocks.push_back(operand(me * world + q, count, dtype, op, 2));
          }
          std::vector<Bytes> mine_of_each;
          for (int r = 0; r < world; ++r) {
            mine_of_each.push_back(
                operand(r * world + me, count, dtype, op, 2));
          }
          const Bytes expected = fold(mine_of_each, count, dtype, op);
          std::vector<const void*> inputs;
          for (const Bytes& block : blocks) inputs.push_back(block.data());
          const CallInfo scatter_call{
              Collective::kReduceScatter,       0,  dtype,
              static_cast<std::int64_t>(count), op, -1};
          Bytes output(bytes, 0x5a);
          rank.run(scatter_call, [&](CollectiveTransport& t) {
            alg::reduce_scatter(t, inputs, output.data(), count, dtype, op);
          });
          expect(output == expected, "reduce_scatter " + what);
          // In place: the output is this rank's own block.
          rank.run(scatter_call, [&](CollectiveTransport& t) {
            alg::reduce_scatter(t, inputs, blocks[me].data(), count, dtype, op);
          });
          expect(blocks[me] == expected, "reduce_scatter in place " + what);
          if (world > 2) mine_expected += 2 * (world - 1) * bytes;

          // reduce, from every root.
          std::vector<Bytes> all;
          for (int r = 0; r < world; ++r) {
            all.push_back(operand(r, count, dtype, op, 3));
          }
          const Bytes reduced = fold(all, count, dtype, op);
          for (int root = 0; root < world; ++root) {
            Bytes data = all[me];
            const CallInfo call{Collective::kReduce,
                                0,
                                dtype,
                                static_cast<std::int64_t>(count),
                                op,
                                root};
            rank.run(call, [&](CollectiveTransport& t) {
              alg::reduce(t, data.data(), count, dtype, op, root);
            });
            if (me == root) {
              expect(data == reduced,
                     "reduce to " + std::to_string(root) + ": " + what);
            }
            if (world > 1 && me == root) {
              // Every rank reads its slice of the others, and the root the
              // others' slices.
              const comm::tcp::algorithms::Segment slice =
                  alg::segment_of(count, world, root);
              mine_expected +=
                  (world - 1) * bytes + bytes -
                  (slice.end - slice.begin) * comm::dtype_size(dtype);
            }
          }
        }
      }
      static std::mutex mutex;
      std::lock_guard<std::mutex> lock(mutex);
      expected_read += mine_expected;
    });
    INFO("world " << world);
    check_all_ok(errors);
    CHECK(read.load() == expected_read);
  }
}

TEST_CASE(
    "broadcast, all_gather, gather and scatter read each byte once, from "
    "every root; at two ranks, a broadcast keeps the rings, and an "
    "all_gather or scatter reads only where the kernel's copy keeps up",
    "[single_copy][broadcast][gather]") {
  for (const char* kernel_copy : {"slow", "fast"}) {
    const bool fast = std::string(kernel_copy) == "fast";
    EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_KERNEL_COPY", kernel_copy}});
    for (int world : {1, 2, 3, 5, 8}) {
      std::atomic<std::size_t> read{0};
      std::size_t expected_read = 0;
      const std::vector<std::size_t> sizes = {0, 1, 13, 70001};
      for (std::size_t bytes : sizes) {
        // all_gather: every rank reads every other block; broadcast,
        // scatter and gather: n - 1 blocks in all, from each root. At two
        // ranks only gather reads, and all_gather and scatter where the
        // kernel's copy keeps up.
        const int reading = world > 2 ? 4 : fast ? 3 : 1;
        expected_read +=
            static_cast<std::size_t>(world) * (world - 1) * bytes * reading;
      }
      auto errors = run_ranks(world, read, [&](Rank& rank) {
        const int me = rank.rank();
        for (std::size_t bytes : sizes) {
          const std::string what =
              std::to_string(bytes) + " bytes, world " + std::to_string(world);
          const auto count = static_cast<std::int64_t>(bytes);
          // all_gather, in place as the backend calls it: this rank's block
          // is already in its place.
          std::vector<Bytes> blocks(world, Bytes(bytes, 0));
          blocks[me] = pattern(me, 0, bytes);
          std::vector<void*> places;
          for (Bytes& block : blocks) places.push_back(block.data());
          rank.run({Collective::kAllGather, 0, DType::kU8, count,
                    ReduceOp::kSum, -1},
                   [&](CollectiveTransport& t) {
                     alg::all_gather(t, places, bytes);
                   });
          for (int r = 0; r < world; ++r) {
            expect(blocks[r] == pattern(r, 0, bytes), "all_gather " + what);
          }
          for (int root = 0; root < world; ++root) {
            const std::string from = what + ", root " + std::to_string(root);
            Bytes data = me == root ? pattern(root, 1, bytes) : Bytes(bytes, 0);
            rank.run({Collective::kBroadcast, 0, DType::kU8, count,
                      ReduceOp::kSum, root},
                     [&](CollectiveTransport& t) {
                       alg::broadcast(t, data.data(), bytes, root);
                     });
            expect(data == pattern(root, 1, bytes), "broadcast " + from);

            const Bytes input = pattern(me, 2, bytes);
            std::vector<Bytes> gathered(me == root ? world : 0, Bytes(bytes));
            std::vector<void*> outputs;
            for (Bytes& block : gathered) outputs.push_back(block.data());
            rank.run({Collective::kGather, 0, DType::kU8, count, ReduceOp::kSum,
                      root},
                     [&](CollectiveTransport& t) {
                       alg::gather(t, input.data(), outputs, bytes, root);
                     });
            for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
              expect(gathered[r] == pattern(r, 2, bytes), "gather " + from);
            }

            std::vector<Bytes> parts;
            std::vector<const void*> inputs;
            if (me == root) {
              for (int r = 0; r < world; ++r)
                parts.push_back(pattern(r, 3, bytes));
              for (const Bytes& part : parts) inputs.push_back(part.data());
            }
            Bytes part(bytes, 0);
            rank.run({Collective::kScatter, 0, DType::kU8, count,
                      ReduceOp::kSum, root},
                     [&](CollectiveTransport& t) {
                       alg::scatter(t, inputs, part.data(), bytes, root);
                     });
            expect(part == pattern(me, 3, bytes), "scatter " + from);
          }
        }
      });
      INFO("world " << world << ", kernel copy " << kernel_copy);
      check_all_ok(errors);
      CHECK(read.load() == expected_read);
    }
  }
}

// Bytes the ranks of a `world` group read of each other in one all_gather
// of `bytes` per block, and in one scatter of `bytes` per part from root 0,
// checking both results.
struct ReadBy {
  std::size_t all_gather = 0;
  std::size_t scatter = 0;
};
ReadBy read_by_all_gather_and_scatter(int world, std::size_t bytes) {
  ReadBy result;
  for (const bool scatter : {false, true}) {
    std::atomic<std::size_t> read{0};
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      const int me = rank.rank();
      const auto count = static_cast<std::int64_t>(bytes);
      if (!scatter) {
        std::vector<Bytes> blocks(world, Bytes(bytes, 0));
        blocks[me] = pattern(me, 0, bytes);
        std::vector<void*> places;
        for (Bytes& block : blocks) places.push_back(block.data());
        rank.run(
            {Collective::kAllGather, 0, DType::kU8, count, ReduceOp::kSum, -1},
            [&](CollectiveTransport& t) { alg::all_gather(t, places, bytes); });
        for (int r = 0; r < world; ++r) {
          expect(blocks[r] == pattern(r, 0, bytes), "all_gather");
        }
        return;
      }
      std::vector<Bytes> parts;
      std::vector<const void*> inputs;
      if (me == 0) {
        for (int r = 0; r < world; ++r) parts.push_back(pattern(r, 3, bytes));
        for (const Bytes& part : parts) inputs.push_back(part.data());
      }
      Bytes part(bytes, 0);
      rank.run({Collective::kScatter, 0, DType::kU8, count, ReduceOp::kSum, 0},
               [&](CollectiveTransport& t) {
                 alg::scatter(t, inputs, part.data(), bytes, 0);
               });
      expect(part == pattern(me, 3, bytes), "scatter");
    });
    check_all_ok(errors);
    (scatter ? result.scatter : result.all_gather) = read.load();
  }
  return result;
}

TEST_CASE(
    "two ranks answer to the two-rank thresholds, and an unset "
    "COMM_SHM_DIRECT_THRESHOLD_BYTES follows the kernel's copy",
    "[single_copy]") {
  const char* never = "1000000000";
  SECTION(
      "all_gather at two ranks: COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES") {
    EnvIs env(
        {{"COMM_SHM_DIRECT_THRESHOLD_BYTES", never},
         {"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", never},
         {"COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", "200"},
         {"COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", never},
         {"COMM_SHM_KERNEL_COPY", "fast"}});
    const ReadBy read = read_by_all_gather_and_scatter(2, 100);
    CHECK(read.all_gather == 200);  // each rank reads the other's block
    CHECK(read.scatter == 0);
    // One byte under the threshold: the rings.
    CHECK(read_by_all_gather_and_scatter(2, 99).all_gather == 0);
  }
  SECTION("scatter at two ranks: its own threshold") {
    EnvIs env(
        {{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
         {"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1"},
         {"COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", never},
         {"COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", "200"},
         {"COMM_SHM_KERNEL_COPY", "fast"}});
    const ReadBy read = read_by_all_gather_and_scatter(2, 100);
    CHECK(read.all_gather == 0);
    CHECK(read.scatter == 100);  // rank 1 reads its part
    CHECK(read_by_all_gather_and_scatter(2, 99).scatter == 0);
  }
  SECTION("a slow kernel copy keeps two ranks on the rings") {
    EnvIs env({{"COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_KERNEL_COPY", "slow"}});
    const ReadBy read = read_by_all_gather_and_scatter(2, 100);
    CHECK(read.all_gather == 0);
    CHECK(read.scatter == 0);
  }
  SECTION("three ranks, the threshold unset: 1 MiB or 64 MiB") {
    // Three blocks of 400,000 bytes: 1.2 MB, between the two defaults.
    const std::size_t block = 400000;
    for (const char* word : {"fast", "slow"}) {
      EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", nullptr},
                 {"COMM_SHM_KERNEL_COPY", word}});
      INFO("COMM_SHM_KERNEL_COPY=" << word);
      const bool fast = std::string(word) == "fast";
      CHECK(read_by_all_gather_and_scatter(3, block).all_gather ==
            (fast ? 3 * 2 * block : 0));
    }
  }
}

TEST_CASE(
    "all_to_all reads the parts of a world-th of the threshold or above "
    "and carries the smaller ones, from three ranks, and at two where the "
    "kernel's copy keeps up",
    "[single_copy][all_to_all]") {
  for (const char* kernel_copy : {"slow", "fast"}) {
    for (int world : {1, 2, 3, 4, 7}) {
      // Parts of 64 bytes or more are read.
      const std::string threshold = std::to_string(64 * world);
      EnvIs env(
          {{"COMM_SHM_DIRECT_THRESHOLD_BYTES", threshold.c_str()},
           {"COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", threshold.c_str()},
           {"COMM_SHM_KERNEL_COPY", kernel_copy}});
      const bool reads =
          world > 2 || (world == 2 && std::string(kernel_copy) == "fast");
      std::atomic<std::size_t> read{0};
      // Rank r sends rank p (r * 3 + p * 5) % 41 int32 (0 to 160 bytes).
      auto part_bytes = [](int from, int to) -> std::size_t {
        return static_cast<std::size_t>((from * 3 + to * 5) % 41) * 4;
      };
      std::size_t expected_read = 0;
      for (int from = 0; reads && from < world; ++from) {
        for (int to = 0; to < world; ++to) {
          if (from != to && part_bytes(from, to) >= 64) {
            expected_read += part_bytes(from, to);
          }
        }
      }
      auto errors = run_ranks(world, read, [&](Rank& rank) {
        all_to_all_once(rank, part_bytes, 0, "all_to_all");
      });
      INFO("world " << world << ", kernel copy " << kernel_copy);
      check_all_ok(errors);
      CHECK(read.load() == expected_read);
    }
  }
}

TEST_CASE(
    "all_to_all ranks that read nothing run pairwise steps beside ranks "
    "that read",
    "[single_copy][all_to_all]") {
  // Parts of 64 bytes or more are read; every exchange that sends bytes
  // runs pairwise steps (COMM_TCP_DIRECT_THRESHOLD_BYTES 0). Only the
  // pairs 0 -> 1 and, at five ranks, 3 -> 2 have parts that large, so
  // the ranks with no part read at either end run n - 1 pairwise steps
  // while the others run one step of parts and addresses, the reads, and
  // a last step; each pair must still meet its messages in order, call
  // after call. Only the ranks with a part read offer their memory.
  for (int world : {4, 5}) {
    const std::string threshold = std::to_string(64 * world);
    EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", threshold.c_str()},
               {"COMM_TCP_DIRECT_THRESHOLD_BYTES", "0"}});
    std::atomic<std::size_t> read{0};
    auto part_bytes = [&](int from, int to) -> std::size_t {
      if (from == 0 && to == 1) return 256;
      if (world == 5 && from == 3 && to == 2) return 4096;
      return static_cast<std::size_t>(4 * (1 + (from + 2 * to) % 3));
    };
    const int rounds = 3;
    const std::size_t expected_read =
        rounds * (world == 5 ? 256 + 4096 : std::size_t{256});
    const std::size_t expected_offers = rounds * (world == 5 ? 4 : 2);
    offers_made = 0;
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      for (int round = 0; round < rounds; ++round) {
        all_to_all_once(rank, part_bytes, round,
                        "round " + std::to_string(round));
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
    CHECK(read.load() == expected_read);
    CHECK(offers_made.load() == expected_offers);
  }
}

TEST_CASE("below the threshold nothing is read", "[single_copy]") {
  EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1000000"}});
  std::atomic<std::size_t> read{0};
  auto errors = run_ranks(4, read, [&](Rank& rank) {
    const std::size_t count = 20000;  // 80 KB
    std::vector<Bytes> operands;
    for (int r = 0; r < 4; ++r) {
      operands.push_back(operand(r, count, DType::kI32, ReduceOp::kSum, 4));
    }
    Bytes data = operands[rank.rank()];
    rank.run({Collective::kAllReduce, 0, DType::kI32,
              static_cast<std::int64_t>(count), ReduceOp::kSum, -1},
             [&](CollectiveTransport& t) {
               alg::all_reduce(t, data.data(), data.data(), count, DType::kI32,
                               ReduceOp::kSum);
             });
    expect(data == fold(operands, count, DType::kI32, ReduceOp::kSum),
           "all_reduce");
    std::vector<Bytes> blocks(4, Bytes(80000, 0));
    blocks[rank.rank()] = pattern(rank.rank(), 0, 80000);
    std::vector<void*> places;
    for (Bytes& block : blocks) places.push_back(block.data());
    rank.run(
        {Collective::kAllGather, 0, DType::kU8, 80000, ReduceOp::kSum, -1},
        [&](CollectiveTransport& t) { alg::all_gather(t, places, 80000); });
    for (int r = 0; r < 4; ++r) {
      expect(blocks[r] == pattern(r, 0, 80000), "all_gather");
    }
  });
  check_all_ok(errors);
  CHECK(read.load() == 0);
}

TEST_CASE(
    "broadcast and scatter follow their own threshold, the collectives "
    "among all ranks theirs",
    "[single_copy]") {
  const int world = 4;
  // Sizes whose reads add up differently for each kind: an all_gather of
  // four blocks of 10000 bytes (120000 read in all where it reads
  // directly), a broadcast of 80000 (240000) and a scatter of four parts of
  // 30000 (90000), all below the 1000000 that turns a kind off.
  const std::size_t block = 10000, message = 80000, part = 30000;
  auto run = [&]() {
    std::atomic<std::size_t> read{0};
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      const int me = rank.rank(), root = 2;
      std::vector<Bytes> blocks(world, Bytes(block, 0));
      blocks[me] = pattern(me, 4, block);
      std::vector<void*> places;
      for (Bytes& b : blocks) places.push_back(b.data());
      rank.run(
          {Collective::kAllGather, 0, DType::kU8,
           static_cast<std::int64_t>(block), ReduceOp::kSum, -1},
          [&](CollectiveTransport& t) { alg::all_gather(t, places, block); });
      for (int r = 0; r < world; ++r) {
        expect(blocks[r] == pattern(r, 4, block), "all_gather");
      }
      Bytes data = me == root ? pattern(root, 3, message) : Bytes(message, 0);
      rank.run({Collective::kBroadcast, 0, DType::kU8,
                static_cast<std::int64_t>(message), ReduceOp::kSum, root},
               [&](CollectiveTransport& t) {
                 alg::broadcast(t, data.data(), message, root);
               });
      expect(data == pattern(root, 3, message), "broadcast");
      std::vector<Bytes> parts;
      std::vector<const void*> inputs;
      if (me == root) {
        for (int r = 0; r < world; ++r) parts.push_back(pattern(r, 5, part));
        for (const Bytes& p : parts) inputs.push_back(p.data());
      }
      Bytes mine(part, 0);
      rank.run({Collective::kScatter, 0, DType::kU8,
                static_cast<std::int64_t>(part), ReduceOp::kSum, root},
               [&](CollectiveTransport& t) {
                 alg::scatter(t, inputs, mine.data(), part, root);
               });
      expect(mine == pattern(me, 5, part), "scatter");
    });
    check_all_ok(errors);
    return read.load();
  };
  const std::size_t among_all = world * (world - 1) * block;
  const std::size_t from_root = (world - 1) * (message + part);
  SECTION("only the collectives among all ranks reach theirs") {
    EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
               {"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1000000"}});
    CHECK(run() == among_all);
  }
  SECTION("only broadcast and scatter reach theirs") {
    EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1000000"},
               {"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1"}});
    CHECK(run() == from_root);
  }
}

TEST_CASE("gather and reduce follow their own threshold", "[single_copy]") {
  // Past COMM_SHM_DIRECT_THRESHOLD_BYTES but below the to-root one: the
  // root takes every byte over the rings, and nobody reads.
  EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES", "1000000"}});
  std::atomic<std::size_t> read{0};
  auto errors = run_ranks(4, read, [&](Rank& rank) {
    const int me = rank.rank(), root = 2;
    const std::size_t bytes = 80000;
    const Bytes input = pattern(me, 2, bytes);
    std::vector<Bytes> gathered(me == root ? 4 : 0, Bytes(bytes));
    std::vector<void*> outputs;
    for (Bytes& block : gathered) outputs.push_back(block.data());
    rank.run({Collective::kGather, 0, DType::kU8,
              static_cast<std::int64_t>(bytes), ReduceOp::kSum, root},
             [&](CollectiveTransport& t) {
               alg::gather(t, input.data(), outputs, bytes, root);
             });
    for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
      expect(gathered[r] == pattern(r, 2, bytes), "gather");
    }
    const std::size_t count = 20000;
    std::vector<Bytes> operands;
    for (int r = 0; r < 4; ++r) {
      operands.push_back(operand(r, count, DType::kI32, ReduceOp::kSum, 4));
    }
    Bytes data = operands[me];
    rank.run({Collective::kReduce, 0, DType::kI32,
              static_cast<std::int64_t>(count), ReduceOp::kSum, root},
             [&](CollectiveTransport& t) {
               alg::reduce(t, data.data(), count, DType::kI32, ReduceOp::kSum,
                           root);
             });
    if (me == root) {
      expect(data == fold(operands, count, DType::kI32, ReduceOp::kSum),
             "reduce");
    }
  });
  check_all_ok(errors);
  CHECK(read.load() == 0);
}

TEST_CASE(
    "ranks that disagree on a size fail with MismatchError, reading "
    "nothing",
    "[single_copy][mismatch]") {
  EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"}});
  SECTION("all_gather blocks of two sizes in one call") {
    // The calls' headers agree; only the sizes the ranks offer differ, as
    // they would where a caller's sizes disagree with its call.
    std::atomic<std::size_t> read{0};
    std::vector<std::string> mismatch(3);
    auto errors = run_ranks(3, read, [&](Rank& rank) {
      const std::size_t bytes = rank.rank() == 1 ? 2000 : 1000;
      std::vector<Bytes> blocks(3, Bytes(bytes, 0));
      std::vector<void*> places;
      for (Bytes& block : blocks) places.push_back(block.data());
      try {
        rank.run(
            {Collective::kAllGather, 0, DType::kU8, 1000, ReduceOp::kSum, -1},
            [&](CollectiveTransport& t) { alg::all_gather(t, places, bytes); });
      } catch (const comm::MismatchError& e) {
        mismatch[rank.rank()] = e.what();
      }
    });
    check_all_ok(errors);
    for (int r = 0; r < 3; ++r) {
      INFO("rank " << r);
      CHECK_THAT(mismatch[r], Catch::Contains("2000 bytes") ||
                                  Catch::Contains("expects 2000"));
    }
    CHECK(read.load() == 0);
  }
  SECTION("all_to_all splits that disagree, through the process group") {
    // Three ranks: two keep the rings.
    std::vector<std::string> thrown(3);
    auto errors = comm::testing::run_ranks(
        3,
        [&](comm::ProcessGroup& group) {
          const int me = group.rank();
          // Rank 1 sends rank 0 1000 elements; rank 0 expects 2000. Every
          // other part is 500 elements.
          comm::AllToAllOptions options;
          options.input_split_sizes = {500, 500, 500};
          options.output_split_sizes = {500, 500, 500};
          if (me == 1) options.input_split_sizes[0] = 1000;
          if (me == 0) options.output_split_sizes[1] = 2000;
          const std::int64_t in = me == 1 ? 2000 : 1500;
          const std::int64_t out = me == 0 ? 3000 : 1500;
          comm::Tensor input = comm::Tensor::zeros({in}, DType::kF32);
          comm::Tensor output = comm::Tensor::zeros({out}, DType::kF32);
          try {
            group.all_to_all(output, input, options)->wait();
          } catch (const comm::MismatchError& e) {
            thrown[me] = e.what();
          }
        },
        10s);
    comm::testing::check_all_ok(errors);
    CHECK_THAT(thrown[0], Catch::Contains("4000 bytes") &&
                              Catch::Contains("expects 8000"));
    // The others learn of it from rank 0, with the same words.
    for (int r : {1, 2}) {
      INFO("rank " << r);
      CHECK_THAT(thrown[r], Catch::Contains("4000 bytes"));
    }
  }
}

TEST_CASE("a rank that leaves a call makes its readers fail, naming it",
          "[single_copy][failure]") {
  // Rank 1 offers a buffer, sends its address, and withdraws it, as a rank
  // that fails does; rank 0 reads it only afterwards. What it read must
  // not pass for rank 1's data.
  std::atomic<std::size_t> read{0};
  std::string failure;
  std::promise<void> finished;
  auto done = finished.get_future().share();
  auto errors = run_ranks(2, read, [&](Rank& rank) {
    const CallInfo call{Collective::kBroadcast, 0, DType::kU8, 64,
                        ReduceOp::kSum,         1};
    if (rank.rank() == 1) {
      Bytes data(64, 7);
      rank.run(call, [&](CollectiveTransport& t) {
        {
          const alg::Offer offer(*t.peer_memory());
          std::vector<std::vector<alg::Region>> mine(2);
          mine[0] = {alg::region_of(data.data(), data.size())};
          alg::trade_regions(t, {0}, mine, {}, 0);
        }
        alg::signal(t, {0}, {});  // withdrawn
      });
      done.wait();
      return;
    }
    Bytes data(64, 0);
    const auto start = std::chrono::steady_clock::now();
    try {
      rank.run(call, [&](CollectiveTransport& t) {
        PeerMemory& memory = *t.peer_memory();
        const auto theirs = alg::trade_regions(t, {}, {}, {1}, 1);
        alg::signal(t, {}, {1});
        memory.read(1, theirs[1][0], 0, data.data(), data.size());
        const int read_from = 1;
        memory.confirm({&read_from, 1});
      });
      failure = "read a withdrawn buffer without an error";
    } catch (const comm::PeerError& e) {
      failure = e.peer_rank() == 1 ? "" : e.what();
      if (std::string(e.what()).find("rank 1") == std::string::npos) {
        failure = std::string("does not name rank 1: ") + e.what();
      }
    }
    if (std::chrono::steady_clock::now() - start > 5s) failure += " (slow)";
    finished.set_value();
  });
  check_all_ok(errors);
  CHECK(failure == "");
}

TEST_CASE(
    "a rank on the rings beside ranks that read fails instead of taking an "
    "address for data",
    "[single_copy][mismatch]") {
  // Every rank reads from one byte on, but one rank's transport offers no
  // peer memory, as a rank whose COMM_SHM_DIRECT_* settings differ runs
  // the rings where its peers read. Each call moves 16 bytes, the size of
  // the address and length the readers trade, so only the messages' mark
  // tells an address from data. Where the hidden rank receives (rank 1),
  // it must fail with MismatchError, and so must the rank that sent it an
  // address, whose last step rank 1 never joins. Where it only sends (the
  // root of a broadcast), its receivers must fail so, taking its data for
  // no address; the root itself may return first.
  EnvIs env({{"COMM_SHM_DIRECT_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_KERNEL_COPY", "fast"}});
  constexpr std::size_t kBytes = sizeof(alg::Region);
  struct Case {
    const char* name;
    int world;
    std::function<void(Rank&, bool)> call;
  };
  const std::vector<Case> cases = {
      {"broadcast", 3,
       [](Rank& rank, bool hide) {
         Bytes data = rank.rank() == 0 ? pattern(0, 1, kBytes) : Bytes(kBytes);
         rank.run(
             {Collective::kBroadcast, 0, DType::kU8, kBytes, ReduceOp::kSum, 0},
             [&](CollectiveTransport& t) {
               alg::broadcast(t, data.data(), kBytes, 0);
             },
             hide);
       }},
      {"all_gather", 2,
       [](Rank& rank, bool hide) {
         std::vector<Bytes> blocks(2, Bytes(kBytes, 0));
         blocks[rank.rank()] = pattern(rank.rank(), 2, kBytes);
         std::vector<void*> places{blocks[0].data(), blocks[1].data()};
         rank.run(
             {Collective::kAllGather, 0, DType::kU8, kBytes, ReduceOp::kSum,
              -1},
             [&](CollectiveTransport& t) {
               alg::all_gather(t, places, kBytes);
             },
             hide);
       }},
      {"scatter", 2,
       [](Rank& rank, bool hide) {
         const Bytes first = pattern(0, 3, kBytes);
         const Bytes second = pattern(1, 3, kBytes);
         std::vector<const void*> inputs;
         if (rank.rank() == 0) inputs = {first.data(), second.data()};
         Bytes part(kBytes, 0);
         rank.run(
             {Collective::kScatter, 0, DType::kU8, kBytes, ReduceOp::kSum, 0},
             [&](CollectiveTransport& t) {
               alg::scatter(t, inputs, part.data(), kBytes, 0);
             },
             hide);
       }},
  };
  // Runs `c` with `hidden`'s memory hidden; returns each rank's error and
  // whether it was a MismatchError.
  auto run_case = [](const Case& c, int hidden) {
    std::atomic<std::size_t> read{0};
    std::vector<int> mismatched(static_cast<std::size_t>(c.world), 0);
    auto errors = run_ranks(c.world, read, [&](Rank& rank) {
      try {
        c.call(rank, rank.rank() == hidden);
      } catch (const comm::MismatchError&) {
        mismatched[rank.rank()] = 1;
        throw;
      }
    });
    return std::make_pair(errors, mismatched);
  };
  for (const Case& c : cases) {
    INFO(c.name << ", world " << c.world << ", rank 1 on the rings");
    const auto [errors, mismatched] = run_case(c, 1);
    CHECK(mismatched[1] == 1);
    CHECK(errors[1].find("address") != std::string::npos);
    CHECK_FALSE(errors[0].empty());
  }
  {
    INFO("broadcast, world 3, the root on the rings");
    const auto [errors, mismatched] = run_case(cases[0], 0);
    for (int r : {1, 2}) {
      CHECK(mismatched[r] == 1);
      CHECK(errors[r].find("sends its part where rank " + std::to_string(r) +
                           " expects the address") != std::string::npos);
    }
  }
}

TEST_CASE(
    "a scatter root whose output lies over another rank's part copies its "
    "own part once that part was read",
    "[single_copy]") {
  // The root's parts lie one after another in one buffer, and its output
  // starts halfway through rank 1's part; the other ranks read their parts
  // directly. Each must get its part as it was, and the root its own.
  EnvIs env({{"COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", "1"},
             {"COMM_SHM_KERNEL_COPY", "fast"}});
  const std::size_t bytes = 1 << 16;
  for (int world : {2, 3}) {
    INFO("world " << world);
    std::atomic<std::size_t> read{0};
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      const int me = rank.rank();
      Bytes all;
      std::vector<const void*> inputs;
      Bytes own(bytes, 0);
      void* output = own.data();
      if (me == 0) {
        for (int r = 0; r < world; ++r) {
          const Bytes part = pattern(r, 4, bytes);
          all.insert(all.end(), part.begin(), part.end());
        }
        all.resize(all.size() + bytes, 0);
        for (int r = 0; r < world; ++r)
          inputs.push_back(all.data() + r * bytes);
        output = all.data() + bytes + bytes / 2;
      }
      rank.run({Collective::kScatter, 0, DType::kU8,
                static_cast<std::int64_t>(bytes), ReduceOp::kSum, 0},
               [&](CollectiveTransport& t) {
                 alg::scatter(t, inputs, output, bytes, 0);
               });
      if (me == 0) {
        const auto* out = static_cast<const std::uint8_t*>(output);
        expect(Bytes(out, out + bytes) == pattern(0, 4, bytes), "root's part");
      } else {
        expect(own == pattern(me, 4, bytes), "rank's part");
      }
    });
    check_all_ok(errors);
    CHECK(read.load() == bytes * static_cast<std::size_t>(world - 1));
  }
}

namespace {

// `bytes` of shared host memory (libcomm/shared_host_memory.h), freed with
// the object.
class SharedBytes {
 public:
  explicit SharedBytes(std::size_t bytes)
      : data_(static_cast<std::uint8_t*>(comm::allocate_shared_host(bytes))),
        bytes_(bytes) {}
  explicit SharedBytes(const Bytes& from) : SharedBytes(from.size()) {
    if (!from.empty()) std::memcpy(data_, from.data(), from.size());
  }
  ~SharedBytes() { comm::free_shared_host(data_); }
  SharedBytes(const SharedBytes&) = delete;
  SharedBytes& operator=(const SharedBytes&) = delete;
  std::uint8_t* data() const { return data_; }
  Bytes bytes() const { return Bytes(data_, data_ + bytes_); }

 private:
  std::uint8_t* data_;
  std::size_t bytes_;
};

}  // namespace

TEST_CASE(
    "collectives whose every rank passes shared host memory read it where "
    "it lies from their own threshold on, at two ranks too, with the "
    "references' bits",
    "[single_copy][shared_host]") {
  // The ordinary thresholds stay at their defaults, far above these sizes:
  // only the shared memory makes the ranks read each other's buffers.
  EnvIs env({{"COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES", "1"},
             {"COMM_TCP_CHUNK_BYTES", "4096"}});
  for (int world : {2, 3, 4}) {
    std::atomic<std::size_t> read{0};
    auto errors = run_ranks(world, read, [&](Rank& rank) {
      const int me = rank.rank();
      for (std::size_t count :
           {std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
        const DType dtype = DType::kF32;
        const std::size_t bytes = count * comm::dtype_size(dtype);
        const auto n = static_cast<std::int64_t>(count);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          const std::string what = describe(dtype, op, count, world);
          std::vector<Bytes> operands;
          for (int r = 0; r < world; ++r) {
            operands.push_back(operand(r, count, dtype, op, 7));
          }
          const Bytes expected = fold(operands, count, dtype, op);
          const CallInfo all_reduce{
              Collective::kAllReduce, 0, dtype, n, op, -1};
          {
            SharedBytes data(operands[me]);
            rank.run(all_reduce, [&](CollectiveTransport& t) {
              alg::all_reduce(t, data.data(), data.data(), count, dtype, op);
            });
            expect(data.bytes() == expected, "all_reduce in place: " + what);
          }
          {
            SharedBytes input(operands[me]);
            SharedBytes output(bytes);
            rank.run(all_reduce, [&](CollectiveTransport& t) {
              alg::all_reduce(t, input.data(), output.data(), count, dtype, op);
            });
            expect(output.bytes() == expected, "all_reduce: " + what);
            expect(input.bytes() == operands[me], "input changed: " + what);
          }
          for (int root = 0; root < world; ++root) {
            SharedBytes data(operands[me]);
            rank.run({Collective::kReduce, 0, dtype, n, op, root},
                     [&](CollectiveTransport& t) {
                       alg::reduce(t, data.data(), count, dtype, op, root);
                     });
            // From four ranks the tree runs (in_flat_tree): it adds in
            // another order, and leaves partial results in the non-roots'
            // buffers; the TCP backend's tests check it.
            if (world > 3) continue;
            if (me == root) {
              expect(data.bytes() == expected, "reduce: " + what);
            } else {
              // The root reduced alone, where the buffers lie.
              expect(data.bytes() == operands[me],
                     "reduce wrote a non-root's buffer: " + what);
            }
          }
          // reduce_scatter: rank r's block q is operand(r * world + q).
          std::vector<std::unique_ptr<SharedBytes>> blocks;
          std::vector<const void*> inputs;
          std::vector<Bytes> mine_of_each;
          for (int q = 0; q < world; ++q) {
            blocks.push_back(std::make_unique<SharedBytes>(
                operand(me * world + q, count, dtype, op, 8)));
            inputs.push_back(blocks.back()->data());
            mine_of_each.push_back(
                operand(q * world + me, count, dtype, op, 8));
          }
          SharedBytes reduced(bytes);
          rank.run({Collective::kReduceScatter, 0, dtype, n, op, -1},
                   [&](CollectiveTransport& t) {
                     alg::reduce_scatter(t, inputs, reduced.data(), count,
                                         dtype, op);
                   });
          expect(reduced.bytes() == fold(mine_of_each, count, dtype, op),
                 "reduce_scatter: " + what);
        }
        // all_gather, in place as the backend calls it.
        const std::string what =
            std::to_string(bytes) + " bytes, world " + std::to_string(world);
        SharedBytes gathered(bytes * world);
        std::memcpy(gathered.data() + me * bytes, pattern(me, 0, bytes).data(),
                    bytes);
        std::vector<void*> places;
        for (int r = 0; r < world; ++r)
          places.push_back(gathered.data() + r * bytes);
        rank.run(
            {Collective::kAllGather, 0, DType::kU8,
             static_cast<std::int64_t>(bytes), ReduceOp::kSum, -1},
            [&](CollectiveTransport& t) { alg::all_gather(t, places, bytes); });
        for (int r = 0; r < world; ++r) {
          expect(
              Bytes(gathered.data() + r * bytes,
                    gathered.data() + (r + 1) * bytes) == pattern(r, 0, bytes),
              "all_gather " + what);
        }
        for (int root = 0; root < world; ++root) {
          const std::string from = what + ", root " + std::to_string(root);
          SharedBytes data(me == root ? pattern(root, 1, bytes) : Bytes(bytes));
          rank.run({Collective::kBroadcast, 0, DType::kU8,
                    static_cast<std::int64_t>(bytes), ReduceOp::kSum, root},
                   [&](CollectiveTransport& t) {
                     alg::broadcast(t, data.data(), bytes, root);
                   });
          expect(data.bytes() == pattern(root, 1, bytes), "broadcast " + from);

          SharedBytes input(pattern(me, 2, bytes));
          SharedBytes all(me == root ? bytes * world : 1);
          std::vector<void*> outputs;
          if (me == root) {
            for (int r = 0; r < world; ++r)
              outputs.push_back(all.data() + r * bytes);
          }
          rank.run({Collective::kGather, 0, DType::kU8,
                    static_cast<std::int64_t>(bytes), ReduceOp::kSum, root},
                   [&](CollectiveTransport& t) {
                     alg::gather(t, input.data(), outputs, bytes, root);
                   });
          for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
            expect(Bytes(all.data() + r * bytes,
                         all.data() + (r + 1) * bytes) == pattern(r, 2, bytes),
                   "gather " + from);
          }

          SharedBytes parts(me == root ? bytes * world : 1);
          std::vector<const void*> sources;
          if (me == root) {
            for (int r = 0; r < world; ++r) {
              std::memcpy(parts.data() + r * bytes, pattern(r, 3, bytes).data(),
                          bytes);
              sources.push_back(parts.data() + r * bytes);
            }
          }
          SharedBytes part(bytes);
          rank.run({Collective::kScatter, 0, DType::kU8,
                    static_cast<std::int64_t>(bytes), ReduceOp::kSum, root},
                   [&](CollectiveTransport& t) {
                     alg::scatter(t, sources, part.data(), bytes, root);
                   });
          expect(part.bytes() == pattern(me, 3, bytes), "scatter " + from);
        }
        // all_to_all: rank r sends rank p `bytes` of pattern(r, p + 4).
        SharedBytes send(bytes * world);
        SharedBytes receive(bytes * world);
        std::vector<std::size_t> offsets, sizes(world, bytes);
        for (int p = 0; p < world; ++p) {
          offsets.push_back(p * bytes);
          std::memcpy(send.data() + p * bytes, pattern(me, p + 4, bytes).data(),
                      bytes);
        }
        rank.run({Collective::kAllToAll, 0, DType::kU8, 0, ReduceOp::kSum, -1},
                 [&](CollectiveTransport& t) {
                   alg::all_to_all(t, send.data(), offsets, sizes,
                                   receive.data(), offsets, sizes);
                 });
        for (int p = 0; p < world; ++p) {
          expect(
              Bytes(receive.data() + p * bytes,
                    receive.data() + (p + 1) * bytes) ==
                  pattern(p, me + 4, bytes),
              "all_to_all " + what + ", part from rank " + std::to_string(p));
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
    // Every collective above read the peers' memory.
    CHECK(read.load() > 0);
  }
}

TEST_CASE(
    "a reader maps a peer's block once, keeps it while the peer frees "
    "nothing, and reads a block allocated after a free afresh",
    "[single_copy][shared_host]") {
  EnvIs env({{"COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES", "1"}});
  constexpr std::size_t kBytes = 4096 * 3;
  std::atomic<std::size_t> read{0};
  std::mutex mutex;
  std::vector<int> mappings;  // after each phase, by rank 0
  auto errors = run_ranks(2, read, [&](Rank& rank) {
    const int me = rank.rank();
    auto all_gather = [&](SharedBytes& gathered, int salt) {
      std::memcpy(gathered.data() + me * kBytes,
                  pattern(me, salt, kBytes).data(), kBytes);
      std::vector<void*> places{gathered.data(), gathered.data() + kBytes};
      rank.run(
          {Collective::kAllGather, 0, DType::kU8,
           static_cast<std::int64_t>(kBytes), ReduceOp::kSum, -1},
          [&](CollectiveTransport& t) { alg::all_gather(t, places, kBytes); });
      const int peer = 1 - me;
      expect(Bytes(gathered.data() + peer * kBytes,
                   gathered.data() + (peer + 1) * kBytes) ==
                 pattern(peer, salt, kBytes),
             "the peer's block, salt " + std::to_string(salt));
    };
    auto count_mappings = [&] {
      // A barrier of the two ranks' own, so that both have finished.
      rank.run({Collective::kBarrier, 0, DType::kU8, 0, ReduceOp::kSum, -1},
               [&](CollectiveTransport& t) { alg::barrier(t); });
      if (me == 0) {
        const std::lock_guard lock(mutex);
        mappings.push_back(shared_host_mappings());
      }
      rank.run({Collective::kBarrier, 0, DType::kU8, 0, ReduceOp::kSum, -1},
               [&](CollectiveTransport& t) { alg::barrier(t); });
    };
    {
      SharedBytes gathered(2 * kBytes);
      for (int salt = 0; salt < 5; ++salt) all_gather(gathered, salt);
      count_mappings();
    }
    // Both blocks freed; new ones, perhaps at the same addresses, must be
    // read for what they hold now.
    SharedBytes again(2 * kBytes);
    all_gather(again, 9);
    count_mappings();
  });
  check_all_ok(errors);
  REQUIRE(mappings.size() == 2);
  // Two blocks of their owners', and each mapped once by the other rank,
  // however often it was read.
  CHECK(mappings[0] == 4);
  // The first blocks' mappings were dropped once their owners freed them.
  CHECK(mappings[1] == 4);
}

TEST_CASE(
    "a rank whose buffers are ordinary memory beside ranks whose buffers "
    "are shared fails with MismatchError instead of hanging",
    "[single_copy][shared_host][mismatch]") {
  EnvIs env({{"COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES", "1"}});
  constexpr std::size_t kBytes = sizeof(alg::Region);
  for (int ordinary : {0, 1}) {
    std::atomic<std::size_t> read{0};
    std::vector<int> mismatched(2, 0);
    auto errors = run_ranks(2, read, [&](Rank& rank) {
      const int me = rank.rank();
      std::optional<SharedBytes> shared;
      Bytes plain(2 * kBytes, 0);
      std::uint8_t* data = plain.data();
      if (me != ordinary) {
        shared.emplace(2 * kBytes);
        data = shared->data();
      }
      std::vector<void*> places{data, data + kBytes};
      try {
        rank.run({Collective::kAllGather, 0, DType::kU8,
                  static_cast<std::int64_t>(kBytes), ReduceOp::kSum, -1},
                 [&](CollectiveTransport& t) {
                   alg::all_gather(t, places, kBytes);
                 });
      } catch (const comm::MismatchError&) {
        mismatched[me] = 1;
        throw;
      }
    });
    INFO("rank " << ordinary << " passes ordinary memory");
    CHECK(mismatched[0] + mismatched[1] >= 1);
    for (int r : {0, 1}) {
      if (mismatched[r] == 1) {
        CHECK(errors[r].find("shared host memory") != std::string::npos);
      }
    }
    CHECK_FALSE(errors[0].empty());
    CHECK_FALSE(errors[1].empty());
  }
}

TEST_CASE(
    "at four ranks, one rank with ordinary memory beside ranks with shared "
    "memory: broadcast and reduce run their trees, the others fail with "
    "MismatchError, and no rank waits for its timeout",
    "[single_copy][shared_host][mismatch]") {
  EnvIs env({{"COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES", "1"}});
  constexpr int kWorld = 4;
  constexpr std::size_t kBytes = 64 << 10;
  constexpr std::size_t kCount = kBytes / sizeof(float);
  // Runs `collective` with buffers from `make` (shared or ordinary) on one
  // rank; the names of the calls that must succeed everywhere.
  using Make = std::function<std::uint8_t*(std::size_t)>;
  using Call = std::function<void(Rank&, const Make&)>;
  const std::vector<std::pair<std::string, Call>> calls = {
      {"broadcast",
       [](Rank& rank, const Make& make) {
         std::uint8_t* data = make(kBytes);
         if (rank.rank() == 0)
           std::memcpy(data, pattern(0, 1, kBytes).data(), kBytes);
         rank.run({Collective::kBroadcast, 0, DType::kU8,
                   static_cast<std::int64_t>(kBytes), ReduceOp::kSum, 0},
                  [&](CollectiveTransport& t) {
                    alg::broadcast(t, data, kBytes, 0);
                  });
         expect(Bytes(data, data + kBytes) == pattern(0, 1, kBytes),
                "broadcast");
       }},
      {"reduce",
       [](Rank& rank, const Make& make) {
         auto* data = reinterpret_cast<float*>(make(kBytes));
         for (std::size_t i = 0; i < kCount; ++i) data[i] = float(rank.rank());
         rank.run({Collective::kReduce, 0, DType::kF32,
                   static_cast<std::int64_t>(kCount), ReduceOp::kSum, 0},
                  [&](CollectiveTransport& t) {
                    alg::reduce(t, data, kCount, DType::kF32, ReduceOp::kSum,
                                0);
                  });
         if (rank.rank() == 0) expect(data[kCount - 1] == 6.0f, "reduce");
       }},
      {"all_gather",
       [](Rank& rank, const Make& make) {
         std::uint8_t* all = make(kBytes * kWorld);
         std::vector<void*> places;
         for (int r = 0; r < kWorld; ++r) places.push_back(all + r * kBytes);
         rank.run({Collective::kAllGather, 0, DType::kU8,
                   static_cast<std::int64_t>(kBytes), ReduceOp::kSum, -1},
                  [&](CollectiveTransport& t) {
                    alg::all_gather(t, places, kBytes);
                  });
       }},
      {"all_reduce",
       [](Rank& rank, const Make& make) {
         auto* data = make(kBytes);
         rank.run({Collective::kAllReduce, 0, DType::kF32,
                   static_cast<std::int64_t>(kCount), ReduceOp::kSum, -1},
                  [&](CollectiveTransport& t) {
                    alg::all_reduce(t, data, data, kCount, DType::kF32,
                                    ReduceOp::kSum);
                  });
       }},
      {"gather",
       [](Rank& rank, const Make& make) {
         std::uint8_t* input = make(kBytes);
         std::uint8_t* all = make(kBytes * kWorld);
         std::vector<void*> outputs;
         if (rank.rank() == 0) {
           for (int r = 0; r < kWorld; ++r) outputs.push_back(all + r * kBytes);
         }
         rank.run({Collective::kGather, 0, DType::kU8,
                   static_cast<std::int64_t>(kBytes), ReduceOp::kSum, 0},
                  [&](CollectiveTransport& t) {
                    alg::gather(t, input, outputs, kBytes, 0);
                  });
       }},
  };
  for (const auto& [name, call] : calls) {
    for (int ordinary : {1, 3}) {
      std::atomic<std::size_t> read{0};
      std::vector<int> mismatched(kWorld, 0);
      std::vector<double> seconds(kWorld, 0);
      auto errors = run_ranks(kWorld, read, [&](Rank& rank) {
        std::vector<std::unique_ptr<SharedBytes>> shared;
        std::vector<Bytes> plain;
        plain.reserve(4);
        const Make make = [&](std::size_t bytes) -> std::uint8_t* {
          if (rank.rank() == ordinary) {
            plain.emplace_back(bytes, 0);
            return plain.back().data();
          }
          shared.push_back(std::make_unique<SharedBytes>(bytes));
          return shared.back()->data();
        };
        const auto start = std::chrono::steady_clock::now();
        try {
          call(rank, make);
        } catch (const comm::MismatchError&) {
          mismatched[rank.rank()] = 1;
          seconds[rank.rank()] = std::chrono::duration<double>(
                                     std::chrono::steady_clock::now() - start)
                                     .count();
          throw;
        } catch (...) {
          seconds[rank.rank()] = std::chrono::duration<double>(
                                     std::chrono::steady_clock::now() - start)
                                     .count();
          throw;
        }
        seconds[rank.rank()] = std::chrono::duration<double>(
                                   std::chrono::steady_clock::now() - start)
                                   .count();
      });
      INFO(name << ", rank " << ordinary << " with ordinary memory");
      for (int r = 0; r < kWorld; ++r) {
        INFO("rank " << r << ": " << errors[r]);
        CHECK(seconds[r] < 5.0);
      }
      if (name == "broadcast" || name == "reduce") {
        check_all_ok(errors);
      } else {
        CHECK(std::count(mismatched.begin(), mismatched.end(), 1) >= 1);
      }
    }
  }
}

// Ranks that disagree on their kind of memory after earlier rooted calls
// left confirmations owed between them: a rank that reads directly may first
// wait for the confirmations a peer owes it, while that peer, on the rings'
// algorithm, waits for its data without sending to it (at three ranks, an
// all_reduce whose ring step receives from one neighbour and sends to the
// other), or waits for a third rank that waits for the reader (at four, an
// all_gather whose recursive doubling never meets the reader). What
// breaks the wait is Exchange::send_owed_while_stalled.
TEST_CASE(
    "ranks that disagree on shared host memory after rooted calls left "
    "confirmations owed each way fail with MismatchError, not at the "
    "timeout",
    "[single_copy][shared_host][mismatch]") {
  EnvIs env({{"COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES", "1"}});
  static constexpr std::size_t kBytes = 4096;
  static constexpr std::size_t kCount = kBytes / sizeof(float);
  using Make = std::function<std::uint8_t*(std::size_t)>;
  // A call from `root` (ignored by those that have none) with buffers from
  // `make`.
  using Call = std::function<void(Rank&, const Make&, int root)>;
  const Call broadcast = [](Rank& rank, const Make& make, int root) {
    std::uint8_t* data = make(kBytes);
    rank.run(
        {Collective::kBroadcast, 0, DType::kU8, kBytes, ReduceOp::kSum, root},
        [&](CollectiveTransport& t) { alg::broadcast(t, data, kBytes, root); });
  };
  const Call gather = [](Rank& rank, const Make& make, int root) {
    std::uint8_t* input = make(kBytes);
    std::uint8_t* all = make(kBytes * static_cast<std::size_t>(rank.size()));
    std::vector<void*> outputs;
    for (int r = 0; r < rank.size() && rank.rank() == root; ++r) {
      outputs.push_back(all + static_cast<std::size_t>(r) * kBytes);
    }
    rank.run({Collective::kGather, 0, DType::kU8, kBytes, ReduceOp::kSum, root},
             [&](CollectiveTransport& t) {
               alg::gather(t, input, outputs, kBytes, root);
             });
  };
  const std::vector<std::tuple<std::string, Call, bool>> calls = {
      {"broadcast", broadcast, true},
      {"gather", gather, true},
      {"scatter",
       [](Rank& rank, const Make& make, int root) {
         std::uint8_t* all =
             make(kBytes * static_cast<std::size_t>(rank.size()));
         std::uint8_t* output = make(kBytes);
         std::vector<const void*> inputs;
         for (int r = 0; r < rank.size() && rank.rank() == root; ++r) {
           inputs.push_back(all + static_cast<std::size_t>(r) * kBytes);
         }
         rank.run({Collective::kScatter, 0, DType::kU8, kBytes, ReduceOp::kSum,
                   root},
                  [&](CollectiveTransport& t) {
                    alg::scatter(t, inputs, output, kBytes, root);
                  });
       },
       true},
      {"reduce",
       [](Rank& rank, const Make& make, int root) {
         std::uint8_t* data = make(kBytes);
         rank.run({Collective::kReduce, 0, DType::kF32, kCount, ReduceOp::kSum,
                   root},
                  [&](CollectiveTransport& t) {
                    alg::reduce(t, data, kCount, DType::kF32, ReduceOp::kSum,
                                root);
                  });
       },
       true},
      {"all_reduce",
       [](Rank& rank, const Make& make, int) {
         std::uint8_t* data = make(kBytes);
         rank.run({Collective::kAllReduce, 0, DType::kF32, kCount,
                   ReduceOp::kSum, -1},
                  [&](CollectiveTransport& t) {
                    alg::all_reduce(t, data, data, kCount, DType::kF32,
                                    ReduceOp::kSum);
                  });
       },
       false},
      {"all_gather",
       [](Rank& rank, const Make& make, int) {
         std::uint8_t* all =
             make(kBytes * static_cast<std::size_t>(rank.size()));
         std::vector<void*> places;
         for (int r = 0; r < rank.size(); ++r) {
           places.push_back(all + static_cast<std::size_t>(r) * kBytes);
         }
         rank.run({Collective::kAllGather, 0, DType::kU8, kBytes,
                   ReduceOp::kSum, -1},
                  [&](CollectiveTransport& t) {
                    alg::all_gather(t, places, kBytes);
                  });
       },
       false},
      {"all_to_all",
       [](Rank& rank, const Make& make, int) {
         const auto n = static_cast<std::size_t>(rank.size());
         std::uint8_t* input = make(kBytes * n);
         std::uint8_t* output = make(kBytes * n);
         std::vector<std::size_t> offsets, sizes(n, kBytes);
         for (std::size_t p = 0; p < n; ++p) offsets.push_back(p * kBytes);
         rank.run({Collective::kAllToAll, 0, DType::kU8,
                   static_cast<std::int64_t>(kBytes * n), ReduceOp::kSum, -1},
                  [&](CollectiveTransport& t) {
                    alg::all_to_all(t, input, offsets, sizes, output, offsets,
                                    sizes);
                  });
       },
       false},
  };
  // One rank differs from the others: rank `odd`'s buffers are ordinary
  // memory and the others' shared, or (`odd_shares`) the reverse.
  for (int world : {2, 3, 4}) {
    for (const auto& [name, call, rooted] : calls) {
      for (int odd = 0; odd < world; ++odd) {
        for (bool odd_shares : {false, true}) {
          if (world == 2 && odd_shares) continue;  // the same two ranks
          for (int root = 0; root < (rooted ? world : 1); ++root) {
            std::atomic<std::size_t> read{0};
            std::vector<double> seconds(world, 0);
            std::vector<int> timed_out(world, 0);
            std::vector<int> mismatched(world, 0);
            auto errors = run_ranks(world, read, [&](Rank& rank) {
              std::vector<std::unique_ptr<SharedBytes>> shared;
              std::vector<Bytes> plain;
              plain.reserve(4 * static_cast<std::size_t>(world) + 2);
              const Make ordinary_memory = [&](std::size_t bytes) {
                plain.emplace_back(bytes, 0);
                return plain.back().data();
              };
              // Every rank the root of a broadcast (its children owe it
              // confirmations) and of a gather (it owes them), all agreeing.
              for (int r = 0; r < world; ++r) {
                broadcast(rank, ordinary_memory, r);
                gather(rank, ordinary_memory, r);
              }
              const Make make = [&](std::size_t bytes) -> std::uint8_t* {
                if ((rank.rank() == odd) != odd_shares) {
                  return ordinary_memory(bytes);
                }
                shared.push_back(std::make_unique<SharedBytes>(bytes));
                return shared.back()->data();
              };
              rank.set_timeout(10s);
              const int me = rank.rank();
              // Records how long the call took, however it ends.
              struct Stopwatch {
                double& seconds;
                std::chrono::steady_clock::time_point start =
                    std::chrono::steady_clock::now();
                ~Stopwatch() {
                  seconds = std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - start)
                                .count();
                }
              } stopwatch{seconds[me]};
              try {
                call(rank, make, root);
              } catch (const comm::TimeoutError&) {
                timed_out[me] = 1;
                throw;
              } catch (const comm::MismatchError&) {
                mismatched[me] = 1;
                throw;
              }
            });
            INFO("world " << world << ", " << name << " from root " << root
                          << ", rank " << odd << " alone with "
                          << (odd_shares ? "shared" : "ordinary") << " memory");
            for (int r = 0; r < world; ++r) {
              INFO("rank " << r << " (" << seconds[r] << " s): " << errors[r]);
              CHECK(timed_out[r] == 0);
              CHECK(seconds[r] < 6.0);
            }
            // Where the call fails everywhere, a rank names the
            // disagreement. Where some rank finishes (it read the root
            // directly, say, while a peer on the rings' tree waits for it as
            // its parent), the others fail as it goes on: here, as it leaves
            // the group.
            if (std::none_of(errors.begin(), errors.end(),
                             [](const std::string& e) { return e.empty(); })) {
              CHECK(std::count(mismatched.begin(), mismatched.end(), 1) >= 1);
            }
          }
        }
      }
    }
  }
}
