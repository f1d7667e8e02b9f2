// The TCP backend's collectives against references computed locally, with
// the ranks as threads over a HashStore. Catch2's assertions are not
// thread-safe, so rank threads report problems by throwing, and the test
// thread checks each rank's outcome.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "libcomm/detail/dispatch.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "libcomm/reduce_kernels.h"
#include "store/hash_store.h"
#include "support/env_is.h"
#include "support/forwarding_store.h"
#include "support/rank_checks.h"
#include "support/thread_ranks.h"

using comm::DType;
using comm::HashStore;
using comm::ProcessGroup;
using comm::ReduceOp;
using comm::Tensor;
using comm::testing::check_all_ok;
using comm::testing::EnvIs;
using comm::testing::expect;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

namespace {

// Rank r's contribution for a reduction: values whose every partial result
// is exact in every dtype (so the order of reduction cannot matter), or,
// for integers, full-range bits (wrap-around is order-free too).
Tensor contribution(int rank, std::int64_t count, DType dtype, ReduceOp op) {
  Tensor t = Tensor::empty({count}, dtype);
  std::mt19937_64 rng(static_cast<std::uint64_t>(rank) * 7919 +
                      static_cast<std::uint64_t>(count));
  comm::detail::dispatch_dtype(dtype, [&]<typename T>() {
    auto* data = static_cast<T*>(t.data_ptr());
    for (std::int64_t i = 0; i < count; ++i) {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        data[i] = static_cast<T>(rng());
      } else if constexpr (std::is_same_v<T, bool>) {
        data[i] = (rng() % 3) != 0;
      } else {
        // -1, 0, 1 (and 2 for products, so they grow without rounding).
        const int v = static_cast<int>((rank + i) % 3) - 1;
        data[i] = comm::detail::from_double<T>(
            op == ReduceOp::kProduct && v == 0 ? 2 : v);
      }
    }
  });
  return t;
}

Tensor reference(int world, std::int64_t count, DType dtype, ReduceOp op) {
  const bool divided_first =
      op == ReduceOp::kAvg && comm::averages_divided_first(dtype);
  auto operand = [&](int rank) {
    Tensor t = contribution(rank, count, dtype, op);
    if (divided_first) {
      comm::divide_by(dtype, t.data_ptr(), static_cast<std::size_t>(count),
                      world);
    }
    return t;
  };
  Tensor result = operand(0);
  for (int r = 1; r < world; ++r) comm::reduce_into(op, result, operand(r));
  if (op == ReduceOp::kAvg && !divided_first) {
    comm::divide_by(dtype, result.data_ptr(), static_cast<std::size_t>(count),
                    world);
  }
  return result;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 ||
          std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

bool valid(ReduceOp op, DType dtype) {
  if (comm::is_bitwise(op) && comm::is_floating(dtype)) return false;
  return !(op == ReduceOp::kAvg && dtype == DType::kBool);
}

// A tensor whose element i is base + i, as bytes of `dtype`.
Tensor pattern(std::int64_t count, DType dtype, int base) {
  Tensor t = Tensor::empty({count}, dtype);
  comm::detail::dispatch_dtype(dtype, [&]<typename T>() {
    auto* data = static_cast<T*>(t.data_ptr());
    for (std::int64_t i = 0; i < count; ++i) {
      data[i] =
          comm::detail::from_double<T>(static_cast<double>((base + i) % 100));
    }
  });
  return t;
}

// all_reduce and all_reduce_into of every count in {0, 1, 13, 1003, 70001}
// (the largest for float32, int64 and bfloat16 only) and every valid pair
// of `dtypes` and `ops`, at worlds 1 to 8.
void check_all_reduce(std::span<const DType> dtypes,
                      std::span<const ReduceOp> ops) {
  for (int world = 1; world <= 8; ++world) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      for (std::int64_t count : {0, 1, 13, 1003, 70001}) {
        for (DType dtype : dtypes) {
          for (ReduceOp op : ops) {
            if (!valid(op, dtype)) continue;
            if (count == 70001 && dtype != DType::kF32 &&
                dtype != DType::kI64 && dtype != DType::kBF16) {
              continue;
            }
            const std::string what = std::string(comm::dtype_name(dtype)) +
                                     " " + comm::reduce_op_name(op) + " x " +
                                     std::to_string(count);
            const Tensor expected = reference(world, count, dtype, op);
            Tensor t = contribution(group.rank(), count, dtype, op);
            group.all_reduce(t, {op})->wait();
            expect(same_bytes(t, expected), "all_reduce " + what);
            // Out of place: every byte of the output is written (it starts
            // as garbage) and the input is left as it was.
            const Tensor input = contribution(group.rank(), count, dtype, op);
            Tensor output = Tensor::empty({count}, dtype);
            if (count > 0)
              std::memset(output.data_ptr(), 0x5a, output.nbytes());
            group.all_reduce_into(output, input, {op})->wait();
            expect(same_bytes(output, expected), "all_reduce_into " + what);
            expect(
                same_bytes(input, contribution(group.rank(), count, dtype, op)),
                "all_reduce_into left its input alone: " + what);
          }
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

}  // namespace

TEST_CASE("all_reduce in and out of place, worlds 1 to 8",
          "[tcp][all_reduce]") {
  const DType dtypes[] = {DType::kF32, DType::kI64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax};
  check_all_reduce(dtypes, ops);
}

// The dtypes and ops vary the reduction kernels, not the transports or the
// threads: ThreadSanitizer's copies over other channels leave this out.
TEST_CASE("all_reduce in and out of place: every dtype and op, worlds 1 to 8",
          "[tcp][all_reduce][dtypes]") {
  check_all_reduce(comm::kAllDTypes, comm::kAllReduceOps);
}

TEST_CASE("all_reduce of 1<<20 elements, ring and recursive doubling agree",
          "[tcp][all_reduce]") {
  for (int world : {2, 3, 4}) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const std::int64_t count = 1 << 20;
      for (DType dtype : {DType::kF32, DType::kI32}) {
        const Tensor expected = reference(world, count, dtype, ReduceOp::kSum);
        Tensor t = contribution(group.rank(), count, dtype, ReduceOp::kSum);
        group.all_reduce(t)->wait();
        expect(same_bytes(t, expected), "large all_reduce");
        const Tensor input =
            contribution(group.rank(), count, dtype, ReduceOp::kSum);
        Tensor output = Tensor::zeros({count}, dtype);
        group.all_reduce_into(output, input)->wait();
        expect(same_bytes(output, expected), "large all_reduce_into");
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

TEST_CASE("broadcast and reduce from every root", "[tcp][broadcast][reduce]") {
  for (int world : {1, 2, 3, 5, 8}) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      for (int root = 0; root < world; ++root) {
        for (std::int64_t count : {0, 1, 13, 1003, 300000}) {
          Tensor t = group.rank() == root ? pattern(count, DType::kF32, root)
                                          : Tensor::zeros({count}, DType::kF32);
          group.broadcast(t, {root})->wait();
          expect(same_bytes(t, pattern(count, DType::kF32, root)), "broadcast");

          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
            Tensor r = contribution(group.rank(), count, DType::kI64, op);
            group.reduce(r, {root, op})->wait();
            if (group.rank() == root) {
              expect(same_bytes(r, reference(world, count, DType::kI64, op)),
                     "reduce");
            }
          }
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

TEST_CASE("all_gather, gather and scatter", "[tcp][gather]") {
  for (int world : {1, 2, 3, 4, 7, 8}) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const int me = group.rank();
      for (std::int64_t count : {0, 1, 13, 1003, 100000}) {
        for (DType dtype : {DType::kF16, DType::kI32, DType::kU8}) {
          Tensor mine = pattern(count, dtype, me * 7);
          std::vector<Tensor> outputs;
          for (int r = 0; r < world; ++r)
            outputs.push_back(Tensor::zeros({count}, dtype));
          group.all_gather(outputs, mine)->wait();
          for (int r = 0; r < world; ++r) {
            expect(same_bytes(outputs[r], pattern(count, dtype, r * 7)),
                   "all_gather list");
          }
          // In place: the input is this rank's slot of the output.
          Tensor flat = Tensor::zeros({count * world}, dtype);
          Tensor slot = flat.slice(me * count, (me + 1) * count);
          slot.copy_(mine);
          group.all_gather_into(flat, slot)->wait();
          for (int r = 0; r < world; ++r) {
            expect(same_bytes(flat.slice(r * count, (r + 1) * count),
                              pattern(count, dtype, r * 7)),
                   "all_gather_into");
          }
          // Out of place, and with the input lying in the next rank's
          // slot of the output, which the gather must not overwrite
          // before this rank's block has gone.
          const int next = (me + 1) % world;
          Tensor apart = Tensor::zeros({count * world}, dtype);
          Tensor shared = Tensor::zeros({count * world}, dtype);
          Tensor borrowed = shared.slice(next * count, (next + 1) * count);
          borrowed.copy_(mine);
          group.all_gather_into(apart, mine)->wait();
          group.all_gather_into(shared, borrowed)->wait();
          for (int r = 0; r < world; ++r) {
            const Tensor expected = pattern(count, dtype, r * 7);
            expect(
                same_bytes(apart.slice(r * count, (r + 1) * count), expected),
                "all_gather_into, out of place");
            expect(
                same_bytes(shared.slice(r * count, (r + 1) * count), expected),
                "all_gather_into, input in another rank's slot");
          }
          for (int root = 0; root < world; ++root) {
            std::vector<Tensor> gathered;
            if (me == root) {
              for (int r = 0; r < world; ++r)
                gathered.push_back(Tensor::zeros({count}, dtype));
            }
            group.gather(gathered, mine, {root})->wait();
            for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
              expect(same_bytes(gathered[r], pattern(count, dtype, r * 7)),
                     "gather");
            }
            std::vector<Tensor> parts;
            if (me == root) {
              for (int r = 0; r < world; ++r)
                parts.push_back(pattern(count, dtype, r + root));
            }
            Tensor received = Tensor::zeros({count}, dtype);
            group.scatter(received, parts, {root})->wait();
            expect(same_bytes(received, pattern(count, dtype, me + root)),
                   "scatter");
          }
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

TEST_CASE("reduce_scatter, out of place and in place",
          "[tcp][reduce_scatter]") {
  for (int world : {1, 2, 3, 4, 6, 8}) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const int me = group.rank();
      for (std::int64_t count : {0, 1, 13, 1003, 100000}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kBxor}) {
          std::vector<Tensor> inputs;
          for (int r = 0; r < world; ++r) {
            inputs.push_back(contribution(me * 31 + r, count, DType::kI32, op));
          }
          // Rank r's result: op over every rank's inputs[r].
          auto expected = [&](int r) {
            Tensor result = contribution(r, count, DType::kI32, op);
            for (int q = 1; q < world; ++q) {
              comm::reduce_into(
                  op, result, contribution(q * 31 + r, count, DType::kI32, op));
            }
            return result;
          };
          // Not zeros: a block the call never writes shows.
          Tensor output = Tensor::zeros({count}, DType::kI32);
          std::memset(output.data_ptr(), 0x5a, output.nbytes());
          group.reduce_scatter(output, inputs, {op})->wait();
          expect(same_bytes(output, expected(me)), "reduce_scatter");
          group.reduce_scatter(inputs[me], inputs, {op})->wait();
          expect(same_bytes(inputs[me], expected(me)),
                 "reduce_scatter in place");
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

TEST_CASE("a float16 average fits where the sum would overflow", "[tcp][avg]") {
  // 60000 on every rank: its quotients by 2, 3 and 4 and their sums are
  // exact in float16, whose largest value, 65504, every sum of two or more
  // would pass.
  const double value = 60000;
  const Tensor expected = Tensor::full({1003}, value, DType::kF16);
  for (int world : {2, 3, 4}) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const comm::AllReduceOptions average{.op = ReduceOp::kAvg};
      Tensor t = Tensor::full({1003}, value, DType::kF16);
      group.all_reduce(t, average)->wait();
      expect(same_bytes(t, expected), "all_reduce");
      const Tensor input = Tensor::full({1003}, value, DType::kF16);
      Tensor output = Tensor::zeros({1003}, DType::kF16);
      group.all_reduce_into(output, input, average)->wait();
      expect(same_bytes(output, expected), "all_reduce_into");
      expect(same_bytes(input, expected), "all_reduce_into's input");
      for (int root = 0; root < world; ++root) {
        Tensor r = Tensor::full({1003}, value, DType::kF16);
        group.reduce(r, {.root = root, .op = ReduceOp::kAvg})->wait();
        if (group.rank() == root) expect(same_bytes(r, expected), "reduce");
      }
      std::vector<Tensor> inputs;
      for (int r = 0; r < world; ++r) {
        inputs.push_back(Tensor::full({1003}, value, DType::kF16));
      }
      Tensor block = Tensor::zeros({1003}, DType::kF16);
      group.reduce_scatter(block, inputs, {.op = ReduceOp::kAvg})->wait();
      expect(same_bytes(block, expected), "reduce_scatter");
      for (const Tensor& in : inputs) {
        expect(same_bytes(in, expected), "reduce_scatter's inputs");
      }
      group
          .reduce_scatter(inputs[group.rank()], inputs, {.op = ReduceOp::kAvg})
          ->wait();
      expect(same_bytes(inputs[group.rank()], expected),
             "reduce_scatter in place");
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

TEST_CASE("all_to_all with equal and uneven splits, and in place",
          "[tcp][all_to_all]") {
  for (int world : {1, 2, 3, 5}) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const int me = group.rank();
      // Equal: rank r sends rows [p*k, (p+1)*k) to p; row values encode (r, p).
      const std::int64_t k = 3;
      Tensor input = Tensor::empty({k * world, 2}, DType::kI64);
      for (std::int64_t row = 0; row < k * world; ++row) {
        input.data<std::int64_t>()[row * 2] = me;
        input.data<std::int64_t>()[row * 2 + 1] = row / k;
      }
      Tensor output = Tensor::zeros({k * world, 2}, DType::kI64);
      group.all_to_all(output, input)->wait();
      for (std::int64_t row = 0; row < k * world; ++row) {
        expect(output.data<std::int64_t>()[row * 2] == row / k &&
                   output.data<std::int64_t>()[row * 2 + 1] == me,
               "all_to_all equal splits");
      }
      // In place: one buffer is both input and output.
      Tensor both = input.clone();
      group.all_to_all(both, both)->wait();
      for (std::int64_t row = 0; row < k * world; ++row) {
        expect(both.data<std::int64_t>()[row * 2] == row / k &&
                   both.data<std::int64_t>()[row * 2 + 1] == me,
               "all_to_all in place");
      }
      // Uneven: rank r sends r + p + 1 rows to rank p.
      comm::AllToAllOptions options;
      for (int p = 0; p < world; ++p) {
        options.input_split_sizes.push_back(me + p + 1);
        options.output_split_sizes.push_back(p + me + 1);
      }
      const auto rows_in =
          std::accumulate(options.input_split_sizes.begin(),
                          options.input_split_sizes.end(), std::int64_t{0});
      Tensor uneven_in = Tensor::full({rows_in}, me, DType::kI32);
      Tensor uneven_out = Tensor::zeros({rows_in}, DType::kI32);
      group.all_to_all(uneven_out, uneven_in, options)->wait();
      std::int64_t at = 0;
      for (int p = 0; p < world; ++p) {
        for (int i = 0; i < p + me + 1; ++i) {
          expect(uneven_out.data<std::int32_t>()[at++] == p,
                 "all_to_all uneven");
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

// A rank whose splits are small exchanges with every peer in one step while
// a rank that sends more runs pairwise steps (exchange_directly decides per
// rank); the two must still meet.
TEST_CASE("all_to_all where some ranks send small and others large splits",
          "[tcp][all_to_all]") {
  const int world = 4;
  auto errors = run_ranks(world, [&](ProcessGroup& group) {
    const int me = group.rank();
    // Rank 0 sends 64 Ki int32 (256 KiB, past COMM_TCP_DIRECT_THRESHOLD_BYTES)
    // to each peer; the others send 1 to each.
    auto rows = [](int from) -> std::int64_t { return from == 0 ? 65536 : 1; };
    comm::AllToAllOptions options;
    for (int p = 0; p < world; ++p) {
      options.input_split_sizes.push_back(rows(me));
      options.output_split_sizes.push_back(rows(p));
    }
    const std::int64_t rows_out = 65536 + (world - 1);
    Tensor input = Tensor::full({rows(me) * world}, me + 1, DType::kI32);
    Tensor output = Tensor::zeros({rows_out}, DType::kI32);
    group.all_to_all(output, input, options)->wait();
    std::int64_t at = 0;
    for (int p = 0; p < world; ++p) {
      for (std::int64_t i = 0; i < rows(p); ++i) {
        expect(output.data<std::int32_t>()[at++] == p + 1,
               "all_to_all mixed sizes");
      }
    }
  });
  check_all_ok(errors);
}

// As above, after rooted calls: their receivers owe the root (or, in a
// reduce, the parent its children) a confirmation, sent in a later step
// that sends to it, while a rank that runs the direct step reads what each
// peer owes it before the step's receives. Rank 0 runs pairwise steps,
// whose first sends only to rank 1, so that step first sends all
// it owes; otherwise a root r >= 2 waits for rank 0's confirmation while
// rank 0 waits for r's part, until the timeout (20 s here, so that a
// regression fails in good time).
TEST_CASE("all_to_all with uneven splits after rooted calls",
          "[tcp][all_to_all]") {
  for (int world : {3, 4}) {
    CAPTURE(world);
    auto errors = run_ranks(
        world,
        [&](ProcessGroup& group) {
          const int me = group.rank();
          auto rows = [](int from) -> std::int64_t {
            return from == 0 ? 65536 : 1;
          };
          comm::AllToAllOptions options;
          std::int64_t rows_out = 0;
          for (int p = 0; p < world; ++p) {
            options.input_split_sizes.push_back(rows(me));
            options.output_split_sizes.push_back(rows(p));
            rows_out += rows(p);
          }
          Tensor output = Tensor::zeros({rows_out}, DType::kI32);
          // Every root, for each rooted collective; a round apiece.
          for (int round = 0; round < 3 * world; ++round) {
            const int root = round % world;
            Tensor small =
                Tensor::full({4}, me == root ? round : -1, DType::kI32);
            switch (round / world) {
              case 0: {
                comm::BroadcastOptions rooted;
                rooted.root = root;
                group.broadcast(small, rooted)->wait();
                expect(small.data<std::int32_t>()[3] == round, "broadcast");
                break;
              }
              case 1: {
                comm::ReduceOptions rooted;
                rooted.root = root;
                group.reduce(small, rooted)->wait();
                break;
              }
              default: {
                comm::ScatterOptions rooted;
                rooted.root = root;
                std::vector<Tensor> parts;
                if (me == root) {
                  for (int p = 0; p < world; ++p) {
                    parts.push_back(Tensor::full({4}, p, DType::kI32));
                  }
                }
                group.scatter(small, parts, rooted)->wait();
                expect(small.data<std::int32_t>()[0] == me, "scatter");
                break;
              }
            }
            Tensor input =
                Tensor::full({rows(me) * world}, 100 * round + me, DType::kI32);
            group.all_to_all(output, input, options)->wait();
            std::int64_t at = 0;
            for (int p = 0; p < world; ++p) {
              for (std::int64_t i = 0; i < rows(p); ++i) {
                expect(output.data<std::int32_t>()[at++] == 100 * round + p,
                       "all_to_all after a rooted call");
              }
            }
          }
        },
        std::chrono::seconds(20));
    check_all_ok(errors);
  }
}

TEST_CASE("all_to_all where only one pair of ranks has a large part",
          "[tcp][all_to_all]") {
  // Rank 0 sends rank 1 1 Mi int32 (4 MiB, which rank 1 reads from rank
  // 0's memory over shared memory where the threshold lets four parts of
  // its size, 16 MiB, be read: the plain run sets that, its `_over_tcp`
  // and `_single_copy` copies their own); every other part is one int32,
  // so ranks 2 and 3 read nothing and run the plain direct step beside
  // the two that read.
  const int world = 4;
  const std::int64_t large = 1 << 20;
  std::optional<EnvIs> reads_large;
  if (std::getenv("COMM_TRANSPORT") == nullptr &&
      std::getenv("COMM_SHM_DIRECT_THRESHOLD_BYTES") == nullptr) {
    reads_large.emplace(
        std::initializer_list<std::pair<const char*, const char*>>{
            {"COMM_SHM_DIRECT_THRESHOLD_BYTES", "16777216"}});
  }
  auto rows = [&](int from, int to) -> std::int64_t {
    return from == 0 && to == 1 ? large : 1;
  };
  auto errors = run_ranks(world, [&](ProcessGroup& group) {
    const int me = group.rank();
    comm::AllToAllOptions options;
    std::int64_t rows_in = 0;
    std::int64_t rows_out = 0;
    for (int p = 0; p < world; ++p) {
      options.input_split_sizes.push_back(rows(me, p));
      options.output_split_sizes.push_back(rows(p, me));
      rows_in += rows(me, p);
      rows_out += rows(p, me);
    }
    // Rank r's part for rank p holds 100 * r + p.
    Tensor input = Tensor::zeros({rows_in}, DType::kI32);
    std::int64_t at = 0;
    for (int p = 0; p < world; ++p) {
      for (std::int64_t i = 0; i < rows(me, p); ++i) {
        input.data<std::int32_t>()[at++] = 100 * me + p;
      }
    }
    Tensor output = Tensor::zeros({rows_out}, DType::kI32);
    for (int round = 0; round < 3; ++round) {
      group.all_to_all(output, input, options)->wait();
      at = 0;
      for (int p = 0; p < world; ++p) {
        for (std::int64_t i = 0; i < rows(p, me); ++i) {
          expect(output.data<std::int32_t>()[at++] == 100 * p + me,
                 "all_to_all with one large pair");
        }
      }
    }
  });
  check_all_ok(errors);
}

TEST_CASE("barrier waits for every rank", "[tcp][barrier]") {
  for (int world : {1, 2, 3, 8}) {
    std::atomic<int> arrived{0};
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      for (int round = 0; round < 5; ++round) {
        if (group.rank() == round % world) std::this_thread::sleep_for(20ms);
        arrived++;
        group.barrier()->wait();
        expect(arrived.load() >= (round + 1) * world,
               "barrier let a rank through early");
        group.barrier()->wait();
      }
    });
    check_all_ok(errors);
  }
}

TEST_CASE("send and recv by tag, from any source, in any order", "[tcp][p2p]") {
  auto errors = run_ranks(3, [&](ProcessGroup& group) {
    const int me = group.rank();
    if (me == 0) {
      // Receive tag 2 before tag 1, though rank 1 sends tag 1 first.
      Tensor second = Tensor::zeros({4}, DType::kF32);
      Tensor first = Tensor::zeros({4}, DType::kF32);
      group.recv(second, 1, {2});
      group.recv(first, 1, {1});
      expect(first.data<float>()[3] == 1.0f && second.data<float>()[3] == 2.0f,
             "tags");
      // Any source: both other ranks send; the sources are reported.
      int seen = 0;
      for (int i = 0; i < 2; ++i) {
        Tensor any = Tensor::zeros({1}, DType::kI32);
        const int source = group.recv(any, comm::kAnySource, {7});
        expect(any.data<std::int32_t>()[0] == source * 10,
               "any-source payload");
        seen |= 1 << source;
      }
      expect(seen == 0b110, "any-source saw both senders");
    } else {
      if (me == 1) {
        group.send(Tensor::full({4}, 1.0, DType::kF32), 0, {1});
        group.send(Tensor::full({4}, 2.0, DType::kF32), 0, {2});
      }
      group.send(Tensor::full({1}, me * 10, DType::kI32), 0, {7});
    }
  });
  check_all_ok(errors);
}

TEST_CASE("a receive that times out names the messages it did not match",
          "[tcp][p2p]") {
  // Rank 1 sends with tag 1; rank 0 waits for tag 2. The timeout says what
  // did arrive, so that the tags can be seen to differ.
  std::string thrown;
  auto errors = run_ranks(2, [&](ProcessGroup& group) {
    if (group.rank() == 1) {
      group.send(Tensor::full({4}, 1.0, DType::kF32), 0, {1});
    } else {
      Tensor t = Tensor::zeros({4}, DType::kF32);
      try {
        group.recv(t, 1, {2, std::chrono::milliseconds(500)});
      } catch (const comm::TimeoutError& e) {
        thrown = e.what();
      }
    }
    group.barrier()->wait();
  });
  check_all_ok(errors);
  CHECK_THAT(thrown, Catch::Contains("tag 2") &&
                         Catch::Contains("timed out waiting for rank 1") &&
                         Catch::Contains("1 message arrived that it does not "
                                         "match: send #0 (float32 x 4, tag 1) "
                                         "from rank 1 (a tag differs?)"));
}

TEST_CASE("isend/irecv pairs in both orders, many in flight", "[tcp][p2p]") {
  auto errors = run_ranks(2, [&](ProcessGroup& group) {
    const int peer = 1 - group.rank();
    // Both ranks post the receive first, then the send; and large messages,
    // so neither send can complete into socket buffers alone.
    for (bool receive_first : {true, false}) {
      Tensor out = Tensor::full({1 << 20}, group.rank(), DType::kF32);
      Tensor in = Tensor::zeros({1 << 20}, DType::kF32);
      std::shared_ptr<comm::Work> r, s;
      if (receive_first) {
        r = group.irecv(in, peer);
        s = group.isend(out, peer);
      } else {
        s = group.isend(out, peer);
        r = group.irecv(in, peer);
      }
      s->wait();
      r->wait();
      expect(in.data<float>()[(1 << 20) - 1] == static_cast<float>(peer),
             "exchange");
    }
    std::vector<std::shared_ptr<comm::Work>> works;
    std::vector<Tensor> received;
    for (int i = 0; i < 64; ++i) {
      received.push_back(Tensor::zeros({16}, DType::kI64));
      works.push_back(group.irecv(received.back(), peer, {i}));
    }
    for (int i = 63; i >= 0; --i) {
      works.push_back(
          group.isend(Tensor::full({16}, i, DType::kI64), peer, {i}));
    }
    // Collectives progress independently of the point-to-point traffic.
    Tensor sum = Tensor::full({8}, 1.0, DType::kF32);
    group.all_reduce(sum)->wait();
    expect(sum.data<float>()[0] == 2.0f, "all_reduce amid p2p");
    for (auto& work : works) work->wait();
    for (int i = 0; i < 64; ++i) {
      expect(received[i].data<std::int64_t>()[15] == i,
             "tagged message " + std::to_string(i));
    }
  });
  check_all_ok(errors);
}

TEST_CASE("many async collectives in flight complete in issue order", "[tcp]") {
  auto errors = run_ranks(4, [&](ProcessGroup& group) {
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<comm::Work>> works;
    for (int i = 0; i < 50; ++i) {
      tensors.push_back(Tensor::full({100 + i}, i, DType::kI32));
      works.push_back(group.all_reduce(tensors.back()));
    }
    for (int i = 49; i >= 0; --i) works[i]->wait();
    for (int i = 0; i < 50; ++i) {
      expect(tensors[i].data<std::int32_t>()[0] == 4 * i,
             "async all_reduce " + std::to_string(i));
      expect(works[i]->is_completed() && works[i]->is_success(), "work state");
    }
  });
  check_all_ok(errors);
}

TEST_CASE("a call whose caller waits (async_op false) keeps issue order",
          "[tcp]") {
  auto errors = run_ranks(3, [&](ProcessGroup& group) {
    const int rank = group.rank();
    // Nothing queued: it runs before it returns.
    Tensor alone = Tensor::full({64}, rank + 1, DType::kI32);
    auto work = group.all_reduce(alone, {.async_op = false});
    expect(work->is_completed(), "a lone blocking call returns completed");
    work->wait();
    expect(alone.data<std::int32_t>()[63] == 6, "its result");
    // Behind calls nobody has waited for, it runs after them: the sum of
    // 1, 2 and 3 first, then the product of the sums (6 * 6 * 6), where
    // the other order would give 3 * (1 * 2 * 3).
    for (int round = 0; round < 20; ++round) {
      Tensor t = Tensor::full({8}, rank + 1, DType::kI32);
      std::vector<std::shared_ptr<comm::Work>> earlier;
      for (int i = 0; i < round % 4; ++i) {
        earlier.push_back(group.barrier());
      }
      auto sum = group.all_reduce(t);
      auto product =
          group.all_reduce(t, {.op = ReduceOp::kProduct, .async_op = false});
      product->wait();
      expect(sum->is_completed() && sum->is_success(),
             "the earlier call completed first");
      for (auto& barrier : earlier) {
        expect(barrier->is_completed(), "earlier barriers completed first");
      }
      expect(t.data<std::int32_t>()[7] == 216,
             "round " + std::to_string(round) + ": sum, then product");
    }
  });
  check_all_ok(errors);
}

TEST_CASE("a queued call keeps its own handles of the caller's tensors",
          "[tcp]") {
  // A call that runs after it returned must not refer to the caller's
  // Tensor objects, which may be gone by then: here they are destroyed
  // before the call runs, and only other handles to the same memory
  // remain. The call is queued because nobody waits for it, or because
  // the caller waits but an earlier call is still queued: ranks 1 and 2
  // issue theirs behind a barrier that rank 0 joins only once they have
  // seen their calls still pending.
  const bool blocking = GENERATE(false, true);
  CAPTURE(blocking);
  std::atomic<int> pending_seen{0};
  auto errors = run_ranks(3, [&](ProcessGroup& group) {
    const int rank = group.rank();
    for (int round = 0; round < 5; ++round) {
      if (rank == 0) {
        // Bounded: 10 s of 1 ms naps.
        for (int nap = 0; nap < 10000 && pending_seen < 2 * (round + 1);
             ++nap) {
          std::this_thread::sleep_for(1ms);
        }
      }
      auto earlier = group.barrier();
      Tensor summed_view, gathered_view;
      std::shared_ptr<comm::Work> sum, gather;
      {
        Tensor summed = Tensor::full({4}, rank + round, DType::kI32);
        summed_view = summed;
        std::vector<Tensor> gathered;
        for (int r = 0; r < 3; ++r) {
          gathered.push_back(Tensor::zeros({2}, DType::kI32));
        }
        gathered_view = gathered[2];
        sum = group.all_reduce(summed, {.async_op = !blocking});
        gather =
            group.all_gather(gathered, Tensor::full({2}, rank, DType::kI32),
                             {.async_op = !blocking});
      }
      if (rank != 0) {
        expect(!sum->is_completed() && !gather->is_completed(),
               "the calls were queued behind the barrier");
        ++pending_seen;
      }
      gather->wait();
      expect(earlier->is_completed() && sum->is_completed(), "issue order");
      expect(summed_view.data<std::int32_t>()[3] == 3 + 3 * round,
             "round " + std::to_string(round) + ": the sum");
      expect(gathered_view.data<std::int32_t>()[1] == 2,
             "round " + std::to_string(round) + ": rank 2's block");
    }
  });
  check_all_ok(errors);
}

TEST_CASE("a blocking call that fails returns a Work that rethrows", "[tcp]") {
  std::vector<std::string> seen(2);
  auto errors = run_ranks(
      2,
      [&](ProcessGroup& group) {
        Tensor t = Tensor::zeros({group.rank() == 0 ? 10 : 20}, DType::kF32);
        // The disagreement surfaces in wait(), not in the call, as for
        // every other collective.
        auto work = group.all_reduce(t, {.async_op = false});
        try {
          work->wait();
        } catch (const comm::MismatchError& e) {
          seen[group.rank()] = e.what();
        }
        // A blocking call after the failure is refused the same way.
        auto refused = group.barrier({.async_op = false});
        try {
          refused->wait();
          expect(false, "a barrier after the failure ran");
        } catch (const comm::BackendError& e) {
          expect(
              std::string(e.what()).find("failed earlier") != std::string::npos,
              std::string("the refusal says why: ") + e.what());
        }
      },
      10s);
  check_all_ok(errors);
  for (const std::string& text : seen) {
    CHECK_THAT(text, Catch::Contains("all_reduce #0 (float32 x 10, sum)"));
  }
}

TEST_CASE("a call that promises nothing (async_op true) returns at once",
          "[tcp]") {
  // Rank 0 issues its all_reduce before the others, who wait until that
  // call has returned: were it to run before returning, it would wait for
  // them, and they for it, until the time-out.
  std::atomic<bool> issued{false};
  auto errors = run_ranks(
      3,
      [&](ProcessGroup& group) {
        Tensor t = Tensor::full({32}, group.rank() + 1, DType::kI32);
        std::shared_ptr<comm::Work> work;
        if (group.rank() == 0) {
          work = group.all_reduce(t);
          issued = true;
        } else {
          // Bounded: 10 s of 1 ms naps.
          for (int nap = 0; nap < 10000 && !issued; ++nap) {
            std::this_thread::sleep_for(1ms);
          }
          expect(issued.load(), "rank 0's call returned before it ran");
          work = group.all_reduce(t);
        }
        work->wait();
        expect(t.data<std::int32_t>()[31] == 6, "its result");
      },
      20s);
  check_all_ok(errors);
}

TEST_CASE("work nobody waits on starts by itself even after waited-on calls",
          "[tcp]") {
  // Waited-on calls leave the worker nothing to do, which lengthens the
  // time it leaves new work to its caller, and blocking calls (async_op
  // false) never even arm its timer; work that is never waited on must
  // still start by itself.
  const bool blocking = GENERATE(false, true);
  CAPTURE(blocking);
  auto errors = run_ranks(3, [&](ProcessGroup& group) {
    Tensor t = Tensor::zeros({16}, DType::kI32);
    for (int i = 0; i < 200; ++i) {
      group.all_reduce(t, {.async_op = !blocking})->wait();
    }
    for (int round = 0; round < 3; ++round) {
      Tensor async = Tensor::full({16}, round, DType::kI32);
      auto work = group.all_reduce(async);
      // Bounded: 5 s of 1 ms naps; is_completed() never runs the work.
      for (int nap = 0; nap < 5000 && !work->is_completed(); ++nap) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      expect(work->is_completed() && work->is_success(),
             "un-waited all_reduce " + std::to_string(round) + " ran");
      expect(async.data<std::int32_t>()[0] == 3 * round, "its result");
      group.all_reduce(t)->wait();
    }
  });
  check_all_ok(errors);
}

TEST_CASE("subgroups run their own collectives", "[tcp][groups]") {
  auto errors = run_ranks(5, [&](ProcessGroup& group) {
    auto evens = group.new_group({0, 2, 4});
    auto odds = group.new_group({3, 1});
    const bool even = group.rank() % 2 == 0;
    expect((evens != nullptr) == even && (odds != nullptr) == !even,
           "membership");
    ProcessGroup& mine = even ? *evens : *odds;
    expect(mine.rank() == group.rank() / 2,
           "group rank is the index among sorted ranks");
    Tensor t = Tensor::full({3}, group.rank(), DType::kI32);
    mine.all_reduce(t)->wait();
    expect(t.data<std::int32_t>()[0] == (even ? 0 + 2 + 4 : 1 + 3),
           "subgroup sum");
    Tensor all = Tensor::full({1}, 1, DType::kI32);
    group.all_reduce(all)->wait();  // the parent group still works
    expect(all.data<std::int32_t>()[0] == 5, "parent group");
  });
  check_all_ok(errors);
  auto refused = run_ranks(2, [](ProcessGroup& g) { g.new_group({0, 0}); });
  CHECK_THAT(refused[0], Catch::Contains("distinct"));
  refused = run_ranks(2, [](ProcessGroup& g) { g.new_group({1, 2}); });
  CHECK_THAT(refused[1], Catch::Contains("distinct members"));
}

// A root returns before its receivers have confirmed the call (they
// confirm later, see CollectiveStep::expect_confirmation), so it may shut
// down while their confirmations are still on the way, or before a late
// receiver has even started the call. Neither may cost a receiver its data
// or turn into an error: shutting down reads what the peers owe for a
// while, and a receiver's confirmation to a rank that has left counts as
// sent.
TEST_CASE("rooted calls just before the group shuts down all succeed",
          "[tcp][shutdown]") {
  for (int world : {2, 3, 4, 7}) {
    for (int round = 0; round < 8; ++round) {
      // One rank (a receiver in most calls) arrives late at the last call:
      // by a few milliseconds, or in one round by more than the backend
      // waits for confirmations at shutdown.
      const int late = 1 + round % (world - 1);
      const auto delay = round == 7 && world == 3
                             ? std::chrono::milliseconds(1500)
                             : std::chrono::milliseconds(round % 4);
      auto errors = run_ranks(world, [&](ProcessGroup& group) {
        const int me = group.rank();
        for (int call = 0; call < 6; ++call) {
          const int root = (round + call) % world;
          if (call == 5 && me == late) std::this_thread::sleep_for(delay);
          Tensor b =
              Tensor::full({64}, me == root ? call + 1 : -1, DType::kF32);
          switch ((round + call) % 4) {
            case 0:
              group.broadcast(b, {root})->wait();
              expect(b.data<float>()[63] == call + 1, "broadcast data");
              break;
            case 1: {
              std::vector<Tensor> parts;
              if (me == root) {
                for (int q = 0; q < world; ++q)
                  parts.push_back(
                      Tensor::full({64}, q * 10 + call, DType::kF32));
              }
              Tensor part = Tensor::zeros({64}, DType::kF32);
              group.scatter(part, parts, {root})->wait();
              expect(part.data<float>()[0] == me * 10 + call, "scatter data");
              break;
            }
            case 2: {
              Tensor r = Tensor::full({64}, me + 1, DType::kF32);
              group.reduce(r, {root, ReduceOp::kSum})->wait();
              if (me == root) {
                expect(r.data<float>()[5] == world * (world + 1) / 2,
                       "reduce data");
              }
              break;
            }
            case 3: {
              std::vector<Tensor> gathered;
              if (me == root) {
                for (int q = 0; q < world; ++q)
                  gathered.push_back(Tensor::zeros({64}, DType::kF32));
              }
              group
                  .gather(gathered, Tensor::full({64}, me, DType::kF32), {root})
                  ->wait();
              for (int q = 0; q < static_cast<int>(gathered.size()); ++q) {
                expect(gathered[q].data<float>()[1] == q, "gather data");
              }
              break;
            }
          }
        }
      });
      INFO("world " << world << ", round " << round);
      check_all_ok(errors);
    }
  }
}

// The same with messages larger than what loopback delivers at once, so
// that part of a message is still in its sender's socket when the sender
// shuts down: a confirmation that reached the departed sender before the
// receiver had read all of it would reset the connection and lose the
// rest. Once the root is late (gather), once a receiver (broadcast), each
// by more than the backend waits for confirmations as it shuts down.
TEST_CASE(
    "a rank that is late to a large rooted call before shutdown gets "
    "all its data",
    "[tcp][shutdown]") {
  // 400 KiB fits in a local connection's send buffer (256 KiB, doubled by
  // the kernel) and a fresh receive window; 8 MiB does not.
  for (std::int64_t kCount : {100 << 10, 2 << 20})
    for (bool late_root : {false, true}) {
      auto errors = run_ranks(2, [&](ProcessGroup& group) {
        const int me = group.rank();
        const bool late = late_root ? me == 0 : me == 1;
        if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        if (late_root) {
          std::vector<Tensor> gathered;
          if (me == 0) {
            gathered = {Tensor::zeros({kCount}, DType::kF32),
                        Tensor::zeros({kCount}, DType::kF32)};
          }
          group
              .gather(gathered, Tensor::full({kCount}, me + 1, DType::kF32),
                      {0})
              ->wait();
          if (me == 0) {
            expect(gathered[1].data<float>()[kCount - 1] == 2, "gather's tail");
          }
        } else {
          Tensor b = Tensor::full({kCount}, me == 0 ? 7 : 0, DType::kF32);
          group.broadcast(b, {0})->wait();
          expect(b.data<float>()[kCount - 1] == 7, "broadcast's tail");
        }
      });
      INFO((late_root ? "gather, root late" : "broadcast, receiver late")
           << ", " << kCount << " floats");
      check_all_ok(errors);
    }
}

// A root may run several calls ahead of a slow receiver and shut down
// while the last calls' bytes are still in its socket; the receiver's
// confirmations, sent as it catches up, then reach a closed socket. The
// root must not have closed before those bytes arrived.
TEST_CASE("a root that shuts down calls ahead of a slow receiver",
          "[tcp][shutdown]") {
  constexpr std::int64_t kCount = 32 << 10;  // 128 KiB of floats
  auto errors = run_ranks(2, [&](ProcessGroup& group) {
    const int me = group.rank();
    for (int call = 0; call < 12; ++call) {
      if (me == 1 && call >= 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
      }
      Tensor b = Tensor::full({kCount}, me == 0 ? call : -1, DType::kF32);
      group.broadcast(b, {0})->wait();
      expect(b.data<float>()[kCount - 1] == call, "broadcast's tail");
    }
  });
  check_all_ok(errors);
}

// Calls without a single message (an all_reduce of nothing) still count:
// a confirmation owed before them must still be sent in time for a peer
// that reads it after them.
TEST_CASE("confirmations owed across calls that send nothing",
          "[tcp][shutdown]") {
  auto errors = run_ranks(
      2,
      [&](ProcessGroup& group) {
        const int me = group.rank();
        for (int round = 0; round < 3; ++round) {
          std::vector<Tensor> gathered;
          if (me == 0) {
            gathered = {Tensor::zeros({4}, DType::kF32),
                        Tensor::zeros({4}, DType::kF32)};
          }
          group.gather(gathered, Tensor::full({4}, me + 1, DType::kF32), {0})
              ->wait();
          if (me == 0) expect(gathered[1].data<float>()[3] == 2, "gather");
          for (int empty = 0; empty < 9; ++empty) {
            Tensor nothing = Tensor::zeros({0}, DType::kF32);
            group.all_reduce(nothing)->wait();
          }
        }
      },
      std::chrono::seconds(10));
  check_all_ok(errors);
}

// A rank that only sends in a stream of rooted calls reads its peers'
// confirmations a window of calls late, and a rank about to wait for
// confirmations first sends all it owes, one message a call. At three
// ranks, reduces that alternate between roots 1 and 2 leave rank 0 a child
// of every call: ranks 1 and 2 each write it a confirmation every other
// call, which it reads only when the window ends. Those must fit in what
// a ring keeps free when it rewinds (the broadcasts first leave the rings
// to rank 0 emptied 4 KiB in, where the next small write rewinds), or
// ranks 1 and 2 wait to write them while rank 0 fills its rings to them
// with its next 4 KiB blocks, until the timeout.
TEST_CASE("confirmations a rank reads late never fill its channels",
          "[tcp][confirmation]") {
  constexpr int kCalls = 600;
  auto errors = run_ranks(
      3,
      [&](ProcessGroup& group) {
        const int me = group.rank();
        for (int root : {1, 2}) {
          Tensor b = Tensor::full({1024}, root, DType::kF32);
          group.broadcast(b, {root})->wait();
          expect(b.data<float>()[1023] == root, "broadcast");
        }
        for (int call = 0; call < kCalls; ++call) {
          const int root = 1 + call % 2;
          Tensor r = Tensor::full({1024}, me + call, DType::kF32);
          group.reduce(r, {root, ReduceOp::kSum, std::chrono::seconds(5)})
              ->wait();
          if (me == root) {
            expect(r.data<float>()[1023] == 3.0f * call + 3.0f,
                   "reduce " + std::to_string(call));
          }
        }
      },
      std::chrono::seconds(60));
  check_all_ok(errors);
}

TEST_CASE("bad arguments are InvalidArgument before anything is sent",
          "[tcp]") {
  auto errors = run_ranks(2, [&](ProcessGroup& group) {
    Tensor t = Tensor::zeros({4, 4}, DType::kF32);
    Tensor strided =
        Tensor::from_blob(t.data_ptr(), {4, 2}, {4, 1}, DType::kF32);
    auto refuses = [](auto call, const char* needle) {
      try {
        call();
      } catch (const comm::InvalidArgument& e) {
        if (std::string(e.what()).find(needle) != std::string::npos) return;
        throw std::runtime_error(std::string("wrong message: ") + e.what());
      }
      throw std::runtime_error(std::string("accepted a bad call: ") + needle);
    };
    refuses([&] { group.all_reduce(strided); }, "[4, 1]");
    refuses([&] { group.broadcast(t, {5}); }, "root 5");
    refuses([&] { group.all_reduce(t, {ReduceOp::kBand}); }, "band");
    Tensor flat = Tensor::zeros({16}, DType::kF32);
    Tensor half = flat.slice(0, 8);
    refuses([&] { group.all_reduce_into(half, flat.slice(4, 12)); },
            "overlap in part");
    refuses([&] { group.all_reduce_into(half, flat); }, "must match");
    Tensor ints = Tensor::zeros({8}, DType::kI32);
    refuses([&] { group.all_reduce_into(half, ints); }, "int32");
    std::vector<Tensor> one = {t};
    refuses([&] { group.all_gather(one, t); }, "one output tensor per rank");
    refuses([&] { group.send(t, group.rank()); }, "destination");
    // Split sizes whose sum would overflow an int64_t.
    comm::AllToAllOptions huge;
    huge.input_split_sizes = {std::numeric_limits<std::int64_t>::max(), 5};
    refuses([&] { group.all_to_all(t, t, huge); }, "split sizes");
    // Nothing was sent: the group still works.
    group.all_reduce(t)->wait();
  });
  check_all_ok(errors);
}

TEST_CASE("every collective x every dtype x every valid op, world sizes 1 to 8",
          "[tcp][sweep]") {
  for (int world = 1; world <= 8; ++world) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const int me = group.rank();
      for (std::int64_t count : {0, 1, 13, 1003}) {
        for (DType dtype : comm::kAllDTypes) {
          const std::string what = std::string(comm::dtype_name(dtype)) +
                                   " x " + std::to_string(count) + ", world " +
                                   std::to_string(world);
          for (int root = 0; root < world; ++root) {
            Tensor b = me == root ? pattern(count, dtype, root)
                                  : Tensor::zeros({count}, dtype);
            group.broadcast(b, {root})->wait();
            expect(same_bytes(b, pattern(count, dtype, root)),
                   "broadcast " + what);
            for (ReduceOp op : comm::kAllReduceOps) {
              if (!valid(op, dtype)) continue;
              Tensor r = contribution(me, count, dtype, op);
              group.reduce(r, {root, op})->wait();
              if (me == root) {
                expect(same_bytes(r, reference(world, count, dtype, op)),
                       std::string("reduce ") + comm::reduce_op_name(op) + " " +
                           what);
              }
            }
            std::vector<Tensor> gathered, parts;
            if (me == root) {
              for (int q = 0; q < world; ++q) {
                gathered.push_back(Tensor::zeros({count}, dtype));
                parts.push_back(pattern(count, dtype, q + 3 * root));
              }
            }
            group.gather(gathered, pattern(count, dtype, me), {root})->wait();
            for (int q = 0; q < static_cast<int>(gathered.size()); ++q) {
              expect(same_bytes(gathered[q], pattern(count, dtype, q)),
                     "gather " + what);
            }
            Tensor part = Tensor::zeros({count}, dtype);
            group.scatter(part, parts, {root})->wait();
            expect(same_bytes(part, pattern(count, dtype, me + 3 * root)),
                   "scatter " + what);
          }
          std::vector<Tensor> everyone;
          for (int q = 0; q < world; ++q)
            everyone.push_back(Tensor::zeros({count}, dtype));
          group.all_gather(everyone, pattern(count, dtype, me))->wait();
          for (int q = 0; q < world; ++q) {
            expect(same_bytes(everyone[q], pattern(count, dtype, q)),
                   "all_gather " + what);
          }
          for (ReduceOp op : comm::kAllReduceOps) {
            if (!valid(op, dtype)) continue;
            std::vector<Tensor> inputs;
            for (int q = 0; q < world; ++q)
              inputs.push_back(contribution(me, count, dtype, op));
            Tensor out = Tensor::zeros({count}, dtype);
            group.reduce_scatter(out, inputs, {op})->wait();
            expect(same_bytes(out, reference(world, count, dtype, op)),
                   std::string("reduce_scatter ") + comm::reduce_op_name(op) +
                       " " + what);
          }
          Tensor send = Tensor::empty({count * world}, dtype);
          for (int q = 0; q < world; ++q) {
            send.slice(q * count, (q + 1) * count)
                .copy_(pattern(count, dtype, me * 8 + q));
          }
          Tensor got = Tensor::zeros({count * world}, dtype);
          group.all_to_all(got, send)->wait();
          for (int q = 0; q < world; ++q) {
            expect(same_bytes(got.slice(q * count, (q + 1) * count),
                              pattern(count, dtype, q * 8 + me)),
                   "all_to_all " + what);
          }
        }
      }
    });
    INFO("world " << world);
    check_all_ok(errors);
  }
}

namespace {

// Forwards every call to another store, but answers a get of a key ending
// in `late_key` `delay` late.
class LateStore final : public comm::testing::ForwardingStore {
 public:
  LateStore(Store& inner, std::string late_key, std::chrono::milliseconds delay)
      : ForwardingStore(inner), late_key_(std::move(late_key)), delay_(delay) {}

 private:
  comm::Bytes do_get(const std::string& key, Duration timeout) override {
    if (key.ends_with(late_key_)) std::this_thread::sleep_for(delay_);
    return ForwardingStore::do_get(key, timeout);
  }

  std::string late_key_;
  std::chrono::milliseconds delay_;
};

}  // namespace

TEST_CASE(
    "ranks whose set-ups end more than the heartbeat timeout apart are not "
    "declared silent",
    "[tcp][liveness]") {
  // Rank 3 learns rank 2's address 2.5 s late, after connecting to ranks 0
  // and 1: they finish connecting that long before ranks 2 and 3 do, as the
  // lowest ranks of hundreds do, and must not count the others' silence
  // from then.
  const EnvIs heartbeat({{"COMM_HEARTBEAT_TIMEOUT", "1"}});
  const int world = 4;
  auto shared = std::make_shared<HashStore>(60s);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::shared_ptr<comm::Store> store = shared;
        if (rank == 3) {
          store = std::make_shared<LateStore>(*shared, "tcp/addr/2", 2500ms);
        }
        ProcessGroup group(store, rank, world, "tcp", 60s);
        Tensor t = Tensor::full({16}, rank + 1, DType::kF32);
        group.all_reduce(t)->wait();
        expect(t.data<float>()[0] == 10.0f, "all_reduce after a late set-up");
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  check_all_ok(errors);
}

TEST_CASE(
    "an all_to_all in place on shared host memory chooses as its peers out "
    "of place do, though it sends from a copy",
    "[tcp][shared_host]") {
  // 64 KiB parts, above the shared threshold; rank 0 works in place, the
  // others out of place, every buffer shared.
  const int world = 4;
  const std::int64_t part = 16384, n = part * world;
  auto errors = run_ranks(world, [&](ProcessGroup& group) {
    const int me = group.rank();
    Tensor in = Tensor::shared_host_zeros({n}, DType::kF32);
    auto* values = static_cast<float*>(in.data_ptr());
    for (std::int64_t i = 0; i < n; ++i) values[i] = float(me * 1000000 + i);
    Tensor out = me == 0 ? in : Tensor::shared_host_zeros({n}, DType::kF32);
    group.all_to_all(out, in)->wait();
    const auto* got = static_cast<const float*>(out.data_ptr());
    for (int p = 0; p < world; ++p) {
      for (std::int64_t i : {std::int64_t{0}, part - 1}) {
        expect(got[p * part + i] == float(p * 1000000 + me * part + i),
               "part from rank " + std::to_string(p));
      }
    }
  });
  check_all_ok(errors);
}
