// all_reduce: recursive doubling for small messages (log2 rounds, each a
// full exchange with one partner), a chunked ring for large ones
// (reduce-scatter then all-gather, 2(n-1) steps moving 1/n of the data
// each). Out of place, the ring reads the input where it lies. Both give
// every rank bitwise the same result: each element's
// reduction is computed once by one rank (ring), or symmetrically by both
// partners of a commutative op (recursive doubling).
#include <cstdlib>
#include <cstring>

#include "backends/tcp/collective_context.h"

namespace comm::tcp {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

void recursive_doubling(CollectiveContext& ctx, std::uint8_t* data,
                        std::size_t count, DType dtype, ReduceOp op) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  const std::size_t bytes = count * dtype_size(dtype);
  // Fold the ranks beyond the largest power of two into their odd
  // neighbours, run among a power of two, and unfold at the end.
  int pow2 = 1;
  while (pow2 * 2 <= size) pow2 *= 2;
  const int extra = size - pow2;
  std::vector<std::uint8_t> snapshot(bytes);
  auto real_rank = [&](int virtual_rank) {
    return virtual_rank < extra ? 2 * virtual_rank + 1 : virtual_rank + extra;
  };
  int virtual_rank = -1;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      Exchange fold = ctx.step();
      fold.send(rank + 1, data, bytes);
      ctx.run(fold);
    } else {
      Exchange fold = ctx.step();
      fold.recv_reduce(rank - 1, data, bytes, dtype, op);
      ctx.run(fold);
      virtual_rank = rank / 2;
    }
  } else {
    virtual_rank = rank - extra;
  }
  if (virtual_rank >= 0) {
    for (int mask = 1; mask < pow2; mask <<= 1) {
      const int partner = real_rank(virtual_rank ^ mask);
      // Send what we had before this round while reducing into `data`.
      std::memcpy(snapshot.data(), data, bytes);
      Exchange round = ctx.step();
      round.send(partner, snapshot.data(), bytes);
      round.recv_reduce(partner, data, bytes, dtype, op);
      ctx.run(round);
    }
  }
  if (rank < 2 * extra) {
    Exchange unfold = ctx.step();
    if (rank % 2 == 0) {
      unfold.recv(rank + 1, data, bytes);
    } else {
      unfold.send(rank - 1, data, bytes);
    }
    ctx.run(unfold);
  }
}

void ring(CollectiveContext& ctx, const std::uint8_t* input, std::uint8_t* data,
          std::size_t count, DType dtype, ReduceOp op) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  const std::size_t element = dtype_size(dtype);
  const int right = mod(rank + 1, size);
  const int left = mod(rank - 1, size);
  // Segment i: elements [offset(i), offset(i + 1)); the first count % size
  // segments hold one element more.
  const std::size_t base = count / static_cast<std::size_t>(size);
  const std::size_t longer = count % static_cast<std::size_t>(size);
  auto offset = [&](int i) {
    const auto u = static_cast<std::size_t>(i);
    return (u * base + std::min(u, longer)) * element;
  };
  auto length = [&](int i) { return offset(i + 1) - offset(i); };
  // Reduce-scatter. Out of place, every segment's first write is its
  // reduction with the input, and the first send is the input's own
  // segment, so the input is never copied whole.
  for (int s = 0; s < size - 1; ++s) {
    const int out = mod(rank - s, size);
    const int in = mod(rank - s - 1, size);
    Exchange step = ctx.step();
    step.send(right, (s == 0 ? input : data) + offset(out), length(out));
    step.recv_reduce(left, data + offset(in), length(in), dtype, op,
                     input + offset(in));
    ctx.run(step);
  }
  for (int s = 0; s < size - 1; ++s) {
    const int out = mod(rank + 1 - s, size);
    const int in = mod(rank - s, size);
    Exchange step = ctx.step();
    step.send(right, data + offset(out), length(out));
    step.recv(left, data + offset(in), length(in));
    ctx.run(step);
  }
}

}  // namespace

std::size_t ring_threshold_bytes() {
  static const std::size_t value = [] {
    if (const char* env = std::getenv("COMM_TCP_RING_THRESHOLD_BYTES")) {
      const long long parsed = std::atoll(env);
      if (parsed >= 0) return static_cast<std::size_t>(parsed);
    }
    return static_cast<std::size_t>(64 << 10);
  }();
  return value;
}

void all_reduce(CollectiveContext& ctx, const void* input, void* output,
                std::size_t count, DType dtype, ReduceOp op) {
  auto* data = static_cast<std::uint8_t*>(output);
  const auto* source = static_cast<const std::uint8_t*>(input);
  const std::size_t bytes = count * dtype_size(dtype);
  const bool small = bytes < ring_threshold_bytes() ||
                     count < static_cast<std::size_t>(ctx.size());
  if (source != data && (ctx.size() == 1 || small)) {
    std::memcpy(data, source, bytes);
    source = data;
  }
  if (ctx.size() == 1 || count == 0) return;
  if (small) {
    recursive_doubling(ctx, data, count, dtype, op);
  } else {
    ring(ctx, source, data, count, dtype, op);
  }
}

}  // namespace comm::tcp
