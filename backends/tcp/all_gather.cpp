// all_gather: small blocks among a power of two of ranks (four or more)
// double: in step k each rank trades the 2^k blocks it holds with the rank
// whose number differs in bit k, so log2 n steps of one message each way
// fill every block. Other small ones go directly, each rank sending its
// block to every peer and receiving theirs in one step. On a host whose
// ranks share CPUs, and over loopback TCP, each message costs its
// receiver a wake-up, and log2 n of them per rank (two at four ranks)
// cost less than the n - 1 of the direct step (bench/README.md, "Small
// all_gather at four ranks"). Larger ones run a ring, as
// one stream: each rank sends its own block to its right, then passes on
// every block it receives from its left as the bytes arrive, so n - 1
// steps fill every rank's n blocks without waiting for one another.
//
// Over a group spanning hosts (hierarchy.h), the same over the ranks
// ordered host by host: the direct step uses each pair's own link anyway,
// and the ring then crosses from one host to the next once, where ranks of
// hosts that interleave would cross the network at every step. Each
// boundary carries n - 1 blocks, where a host needs only the n - L blocks
// of the other hosts; a two-level all_gather (across hosts among the ranks
// of one local index, then inside each host) would carry only those, but
// needs hosts of equal sizes and H shared-memory phases, one per host's
// blocks, or a ring whose messages gather H blocks each.
//
// Where every rank is on this host and may read the others' memory, and
// the n blocks hold COMM_SHM_DIRECT_THRESHOLD_BYTES or more (at two ranks,
// COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES, and only where the
// kernel's copy keeps up: single_copy.h), each rank reads
// every peer's block from that peer's memory (single_copy.h), after a step that
// trades the blocks' addresses and before one that tells every peer it is
// done, so that no rank returns while a peer still reads its block. A rank
// writes only the blocks of the others, which nobody reads.
#include <cstddef>
#include <memory_resource>
#include <vector>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {
namespace {

// The parts of blocks[first, first + count), each `bytes` long.
void add_blocks(std::pmr::vector<CollectiveStep::Part>& parts,
                std::span<void* const> blocks, int first, int count,
                std::size_t bytes) {
  parts.clear();
  for (int r = first; r < first + count; ++r) {
    append_part(parts,
                static_cast<std::uint8_t*>(blocks[static_cast<std::size_t>(r)]),
                bytes);
  }
}

void recursive_doubling(CollectiveTransport& ctx, std::span<void* const> blocks,
                        std::size_t bytes) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  // The parts live on the stack while they fit (at most size in all, 32
  // bytes each, so up to 32 ranks): two heap allocations are a good part
  // of a small call.
  alignas(std::max_align_t) std::byte parts_memory[1024];
  std::pmr::monotonic_buffer_resource parts(parts_memory, sizeof(parts_memory));
  std::pmr::vector<CollectiveStep::Part> held(&parts);
  std::pmr::vector<CollectiveStep::Part> wanted(&parts);
  held.reserve(static_cast<std::size_t>(size / 2));
  wanted.reserve(static_cast<std::size_t>(size / 2));
  // Before the step of `span`, each rank holds the `span` blocks of the
  // aligned run of ranks it belongs to; its partner, the other half of the
  // run twice as long, holds as many.
  for (int span = 1; span < size; span *= 2) {
    const int partner = rank ^ span;
    add_blocks(held, blocks, rank & ~(span - 1), span, bytes);
    add_blocks(wanted, blocks, partner & ~(span - 1), span, bytes);
    CollectiveStep& step = ctx.step();
    step.relay(partner, held, bytes * static_cast<std::size_t>(span), -1);
    step.recv_parts(partner, wanted, DType::kU8, ReduceOp::kSum);
    step.run();
  }
}

}  // namespace

void all_gather(CollectiveTransport& ctx, std::span<void* const> blocks,
                std::size_t bytes) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  if (size == 1) return;
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    SubgroupTransport ordered = host_ordered(ctx, *hosts);
    std::vector<void*> ordered_blocks;
    for (int r : hosts->host_order()) ordered_blocks.push_back(blocks[r]);
    return all_gather(ordered, ordered_blocks, bytes);
  }
  if (PeerMemory* memory = direct_memory(
          ctx, bytes * static_cast<std::size_t>(size), DirectKind::kAmongAll,
          AtTwoRanks::kReadWhereKernelCopyKeepsUp, buffers_of(blocks, bytes))) {
    const Offer offer(*memory);
    const std::vector<int> others = peers(ctx);
    const std::vector<std::vector<Region>> mine(
        static_cast<std::size_t>(size), {region_of(blocks[rank], bytes)});
    const auto theirs = trade_regions(ctx, others, mine, others, 1);
    for (int peer : others) check_bytes(ctx, peer, theirs[peer][0], bytes);
    for (int peer : others) {
      memory->read(peer, theirs[peer][0], 0, blocks[peer], bytes);
    }
    memory->confirm(others);
    signal(ctx, others, others);
    return;
  }
  if (exchange_directly(ctx, bytes * static_cast<std::size_t>(size - 1))) {
    if (exchange_in_pairs(ctx)) {
      return recursive_doubling(ctx, blocks, bytes);
    }
    CollectiveStep& step = ctx.step();
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      step.send(peer, blocks[rank], bytes);
      step.recv(peer, blocks[peer], bytes);
    }
    step.run();
    return;
  }
  auto block = [&](int r) {
    return CollectiveStep::Part{
        static_cast<std::uint8_t*>(blocks[(r + size) % size]), bytes};
  };
  // Step s receives block rank - s - 1 and sends block rank - s: what the
  // step before received.
  // The parts live on the stack while they fit (2 (size - 1) of them):
  // two heap allocations are a good part of a small call.
  alignas(std::max_align_t) std::byte parts_memory[1024];
  std::pmr::monotonic_buffer_resource parts(parts_memory, sizeof(parts_memory));
  std::pmr::vector<CollectiveStep::Part> incoming(&parts);
  std::pmr::vector<CollectiveStep::Part> outgoing(&parts);
  incoming.reserve(static_cast<std::size_t>(size - 1));
  outgoing.reserve(static_cast<std::size_t>(size - 1));
  outgoing.push_back(block(rank));
  for (int s = 0; s < size - 1; ++s) {
    incoming.push_back(block(rank - s - 1));
    if (s + 1 < size - 1) outgoing.push_back(block(rank - s - 1));
  }
  CollectiveStep& flow = ctx.step();
  const int source = flow.recv_parts((rank + size - 1) % size, incoming,
                                     DType::kU8, ReduceOp::kSum);
  flow.relay((rank + 1) % size, outgoing, bytes, source);
  flow.run();
}

}  // namespace comm::tcp::algorithms
