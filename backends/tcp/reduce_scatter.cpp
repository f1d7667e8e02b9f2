// reduce_scatter: small blocks among a power of two of ranks (four or
// more) halve: in step k each rank keeps the half of the blocks it is
// still reducing that holds its own, and trades the other half with the
// rank whose number differs in bit log2 n - k - 1, which keeps the other;
// each adds what it receives to its half. log2 n steps of one message
// each way leave every rank its own block, reduced in a tree fixed by the
// ranks' numbers, so the result does not depend on the order of arrival
// (a floating-point sum may round differently from the rank order of the
// other paths; which path runs depends on the world and message sizes).
// Each message costs its receiver a wake-up, and log2 n of them cost less
// than the n - 1 of the direct step (all_gather.cpp says the same of
// recursive doubling). Other small ones go directly: each rank sends
// every peer its block of the input and receives every peer's
// contribution to its own in one step, then reduces them in rank order.
// Larger ones run the reduce-scatter half of the
// ring all-reduce: in step s each rank receives the running reduction of
// one block from its left, adds its own contribution, and passes it on;
// after n - 1 steps rank r holds block r reduced over all ranks. The inputs
// are left unchanged; two block-sized buffers (one of them the output) hold
// the running sums, each written as the received sum combined with this
// rank's input block.
//
// Over a group spanning hosts (hierarchy.h), the same over the ranks
// ordered host by host, for the reasons all_gather.cpp gives: the ring
// then crosses from one host to the next once. Each block's result is on
// one rank only, so the order of its reduction needs to agree with no
// other rank's.
//
// Where every rank is on this host and may read the others' memory, and the
// n blocks of the input hold COMM_SHM_DIRECT_THRESHOLD_BYTES or more, each rank
// reads its block of every peer's input where it lies (single_copy.h): the
// ranks trade the addresses of their blocks, each reduces its own, in rank
// order, a chunk at a time, and tells every peer it is done, so that no
// rank returns while a peer still reads its input. The output may be this
// rank's own input block (each chunk is read before it is written); no
// other block is written. Two ranks keep the rings at every size, as
// all_reduce.cpp explains.
#include <cstddef>
#include <cstring>
#include <memory>
#include <memory_resource>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"
#include "libcomm/reduce_kernels.h"

namespace comm::tcp::algorithms {
namespace {

// The inputs are read in the first step only, which leaves the output
// free to be this rank's input block: each step sends the partner's half
// of what this rank reduces so far (its inputs, then `sums`) and reduces
// the partner's contribution to its own half into `sums`, the last step
// into `output`.
void recursive_halving(CollectiveTransport& ctx,
                       std::span<const void* const> inputs, void* output,
                       std::size_t bytes, DType dtype, ReduceOp op) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  // After the first step this rank reduces only the half of the blocks
  // from `origin` on, and sums[b - origin] holds block b's sum so far.
  const int origin = rank & ~(size / 2 - 1);
  const WorkspaceBuffer sums(ctx.workspace(),
                             bytes * static_cast<std::size_t>(size / 2));
  auto sum = [&](int block) {
    return sums.get() + bytes * static_cast<std::size_t>(block - origin);
  };
  // The parts live on the stack while they fit (at most size in all, 32
  // bytes each, so up to 32 ranks): two heap allocations are a good part
  // of a small call.
  alignas(std::max_align_t) std::byte parts_memory[1024];
  std::pmr::monotonic_buffer_resource parts(parts_memory, sizeof(parts_memory));
  std::pmr::vector<CollectiveStep::Part> outgoing(&parts);
  std::pmr::vector<CollectiveStep::Part> incoming(&parts);
  outgoing.reserve(static_cast<std::size_t>(size / 2));
  incoming.reserve(static_cast<std::size_t>(size / 2));
  for (int span = size / 2; span >= 1; span /= 2) {
    const bool first = span == size / 2;
    const int partner = rank ^ span;
    const int kept = rank & ~(span - 1);
    const int given = partner & ~(span - 1);
    outgoing.clear();
    incoming.clear();
    for (int b = given; b < given + span; ++b) {
      append_part(outgoing,
                  first
                      ? static_cast<std::uint8_t*>(const_cast<void*>(inputs[b]))
                      : sum(b),
                  bytes);
    }
    for (int b = kept; b < kept + span; ++b) {
      std::uint8_t* into =
          span == 1 ? static_cast<std::uint8_t*>(output) : sum(b);
      const std::uint8_t* base =
          first ? static_cast<const std::uint8_t*>(inputs[b]) : sum(b);
      incoming.push_back({into, bytes, true, base});
    }
    CollectiveStep& step = ctx.step();
    step.relay(partner, outgoing, bytes * static_cast<std::size_t>(span), -1);
    step.recv_parts(partner, incoming, dtype, op);
    step.run();
  }
}

}  // namespace

void reduce_scatter(CollectiveTransport& ctx,
                    std::span<const void* const> inputs, void* output,
                    std::size_t count, DType dtype, ReduceOp op) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  const std::size_t bytes = count * dtype_size(dtype);
  if (size == 1) {
    if (bytes > 0) std::memmove(output, inputs[rank], bytes);
    return;
  }
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    SubgroupTransport ordered = host_ordered(ctx, *hosts);
    std::vector<const void*> ordered_inputs;
    for (int r : hosts->host_order()) ordered_inputs.push_back(inputs[r]);
    return reduce_scatter(ordered, ordered_inputs, output, count, dtype, op);
  }
  if (PeerMemory* memory = direct_memory(
          ctx, bytes * static_cast<std::size_t>(size), DirectKind::kAmongAll,
          AtTwoRanks::kKeepRings, buffers_of(inputs, bytes))) {
    const Offer offer(*memory);
    const std::vector<int> others = peers(ctx);
    // Peer p gets the address of its block of this rank's input.
    std::vector<std::vector<Region>> mine(static_cast<std::size_t>(size));
    for (int peer : others) mine[peer] = {region_of(inputs[peer], bytes)};
    const auto theirs = trade_regions(ctx, others, mine, others, 1);
    std::vector<Region> blocks(static_cast<std::size_t>(size));
    for (int peer : others) {
      check_bytes(ctx, peer, theirs[peer][0], bytes);
      blocks[peer] = theirs[peer][0];
    }
    reduce_from_peers(ctx, *memory, blocks,
                      static_cast<const std::uint8_t*>(inputs[rank]),
                      static_cast<std::uint8_t*>(output), count, dtype, op);
    memory->confirm(others);
    signal(ctx, others, others);
    return;
  }
  if (exchange_directly(ctx, bytes * static_cast<std::size_t>(size - 1))) {
    if (exchange_in_pairs(ctx)) {
      return recursive_halving(ctx, inputs, output, bytes, dtype, op);
    }
    const WorkspaceBuffer received(ctx.workspace(), bytes * (size - 1));
    // Peer r's contribution lands in slot r, rank order less this rank.
    auto slot = [&](int r) {
      return received.get() +
             bytes * static_cast<std::size_t>(r < rank ? r : r - 1);
    };
    auto contribution = [&](int r) -> const void* {
      return r == rank ? inputs[rank] : slot(r);
    };
    CollectiveStep& step = ctx.step();
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      step.send(peer, inputs[peer], bytes);
      step.recv(peer, slot(peer), bytes);
    }
    step.run();
    if (count == 0) return;
    reduce_pair_into(op, dtype, output, contribution(0), contribution(1),
                     count);
    for (int r = 2; r < size; ++r) {
      reduce_into(op, dtype, output, contribution(r), count);
    }
    return;
  }
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  // The last step must land in `output`, so the buffers alternate such that
  // step size - 2 uses it.
  const WorkspaceBuffer spare(ctx.workspace(), bytes);
  auto accumulator = [&](int s) -> std::uint8_t* {
    return ((size - 2 - s) % 2 == 0) ? static_cast<std::uint8_t*>(output)
                                     : spare.get();
  };
  for (int s = 0; s < size - 1; ++s) {
    const int out = (rank - s - 1 + 2 * size) % size;
    const int in = (rank - s - 2 + 2 * size) % size;
    const void* outgoing = s == 0 ? inputs[out] : accumulator(s - 1);
    std::uint8_t* incoming = accumulator(s);
    CollectiveStep& step = ctx.step();
    step.send(right, outgoing, bytes);
    step.recv_reduce(left, incoming, bytes, dtype, op, inputs[in]);
    step.run();
  }
}

}  // namespace comm::tcp::algorithms
