// scatter: the root sends each rank its part directly, to all at once.
// Each rank confirms to the root, once it has its part, that it is in the
// same call, which the root reads up to a window of calls later: ranks that
// name different roots then read a header naming another root and fail with
// MismatchError, instead of some only sending and returning success (see
// broadcast.cpp).
//
// Over sockets, at four ranks or more and below kScatterTreeBytes in all,
// a tree instead (broadcast's, each rank passing on its subtree's parts,
// confirming to its parent): the root's n - 1 sends, each a system call
// that also runs the receiver's protocol work on loopback, set the pace of
// a small scatter, and the tree spreads them over the ranks in log2(n)
// steps. Over shared memory a send is a copy into a ring, and the extra
// hop would cost a wake-up.
//
// A group spanning hosts sends straight from the root too once the n
// parts reach kScatterTreeBytes: each block then travels once, over its
// receiver's own link. Below that, where the root's system calls, one per
// message over TCP, set the pace, it runs the tree over the ranks ordered
// root first, then the rest of its host, then host by host
// (root_host_first), which spreads the root's sends over the ranks of its
// host: with two hosts of two ranks, the root sends one part over the
// network and two through shared memory to its host's other rank, which
// sends one of them on over the network at the same time. An order that
// sent the other host both its parts in one message, for its first rank
// to pass one on, was slower: its second hop waits for the first
// (bench/README.md, "Scatter across hosts", has the figures).
//
// Where every rank is on this host and may read the others' memory, and
// the n parts hold COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES or more (at
// two ranks, COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES, and
// only where the kernel's copy keeps up: single_copy.h), each
// rank reads its part from the root's memory (single_copy.h): the root
// sends each rank its part's address and size, and returns once every rank
// has said it has read it. The root copies its own part while they read,
// or, where its output lies over another rank's part, once they have read:
// the other algorithms copy it after their sends, so no rank's part is
// overwritten before it left.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/host_partition.h"
#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {

namespace {

// Whether the `bytes` at `a` and at `b` share a byte.
bool overlap(const void* a, const void* b, std::size_t bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return bytes > 0 && x < y + bytes && y < x + bytes;
}

// The root's copy of its own part into its output, which may be that part
// (in place).
void copy_own_part(const void* part, void* output, std::size_t bytes) {
  if (bytes > 0 && part != output) std::memmove(output, part, bytes);
}

// Below this many bytes in all, the tree: at four ranks or more that are
// each a host of their own (over sockets), and in a group spanning hosts.
constexpr std::size_t kScatterTreeBytes = 256 * 1024;

// broadcast's tree (BinomialTree): a rank receives from its parent the
// blocks of its subtree, keeps its own and sends each child the blocks of
// the child's subtree.
void scatter_in_tree(CollectiveTransport& ctx,
                     std::span<const void* const> inputs, void* output,
                     std::size_t bytes, int root) {
  const int size = ctx.size();
  const BinomialTree place(ctx.rank(), size, root);
  const int stride = place.first_power;
  // The subtree's other blocks, in rank order, live in `held` on a rank
  // that relays them: relative rank x's at (x - relative) / stride - 1.
  const std::size_t others =
      static_cast<std::size_t>((size - 1 - place.relative) / stride);
  const WorkspaceBuffer held =
      place.parent >= 0 && bytes > 0 && others > 0
          ? WorkspaceBuffer(ctx.workspace(), bytes * others)
          : WorkspaceBuffer();
  auto block_of = [&](int x) -> const void* {
    if (place.parent < 0) return inputs[place.real(x)];
    return held.get() +
           bytes * static_cast<std::size_t>((x - place.relative) / stride - 1);
  };
  if (place.parent >= 0) {
    const CollectiveStep::Part parts[2] = {
        {static_cast<std::uint8_t*>(output), bytes},
        {held.get(), bytes * others}};
    CollectiveStep& from_parent = ctx.step();
    const int parent = place.real(place.parent);
    from_parent.recv_parts(parent, parts, DType::kU8, ReduceOp::kSum);
    from_parent.send_confirmation(parent);
    from_parent.run();
  }
  if (place.relative + stride < size) {
    CollectiveStep& to_children = ctx.step();
    std::vector<CollectiveStep::Part> parts;
    for (int power = stride; place.relative + power < size; power <<= 1) {
      const int child = place.relative + power;
      parts.clear();
      for (int x = child; x < size; x += power << 1) {
        parts.push_back(
            {static_cast<std::uint8_t*>(const_cast<void*>(block_of(x))),
             bytes});
      }
      to_children.relay(place.real(child), parts, bytes * parts.size(), -1);
      to_children.expect_confirmation(place.real(child));
    }
    to_children.run();
  }
  // The root copies its own part last, as scatter()'s does.
  if (place.parent < 0) copy_own_part(inputs[root], output, bytes);
}

}  // namespace

void scatter(CollectiveTransport& ctx, std::span<const void* const> inputs,
             void* output, std::size_t bytes, int root) {
  const Buffers buffers =
      buffers_of(inputs, bytes) & buffers_of({{output, bytes}});
  if (PeerMemory* memory = direct_memory(
          ctx, judged_bytes(bytes, ctx.size(), buffers), DirectKind::kFromRoot,
          AtTwoRanks::kReadWhereKernelCopyKeepsUp, buffers)) {
    const Offer offer(*memory);
    if (ctx.rank() != root) {
      const auto theirs = trade_regions(ctx, {}, {}, {root}, 1);
      check_bytes(ctx, root, theirs[root][0], bytes);
      memory->read(root, theirs[root][0], 0, output, bytes);
      memory->confirm({&root, 1});
      signal(ctx, {root}, {});
      return;
    }
    const std::vector<int> others = peers(ctx);
    std::vector<std::vector<Region>> mine(static_cast<std::size_t>(ctx.size()));
    for (int peer : others) mine[peer] = {region_of(inputs[peer], bytes)};
    trade_regions(ctx, others, mine, {}, 0);
    // The root's own copy overlaps the peers' reads, unless its output
    // lies over a part that a peer may still be reading.
    const bool over_a_part = std::any_of(
        others.begin(), others.end(),
        [&](int peer) { return overlap(output, inputs[peer], bytes); });
    if (!over_a_part) copy_own_part(inputs[root], output, bytes);
    signal(ctx, {}, others);
    if (over_a_part) copy_own_part(inputs[root], output, bytes);
    return;
  }
  const int size = ctx.size();
  const bool small = bytes * static_cast<std::size_t>(size) < kScatterTreeBytes;
  if (const HostPartition* spanning = spanning_hosts(ctx)) {
    if (small) {
      SubgroupTransport ordered = root_host_first(ctx, *spanning, root);
      std::vector<const void*> ordered_inputs;
      if (ctx.rank() == root) {
        for (int i = 0; i < size; ++i) {
          ordered_inputs.push_back(inputs[ordered.member(i)]);
        }
      }
      return scatter_in_tree(ordered, ordered_inputs, output, bytes, 0);
    }
  } else if (const HostPartition* hosts = ctx.hosts();
             size >= 4 && small &&
             (hosts == nullptr || hosts->host_count() > 1)) {
    return scatter_in_tree(ctx, inputs, output, bytes, root);
  }
  if (ctx.rank() != root) {
    CollectiveStep& from_root = ctx.step();
    from_root.recv(root, output, bytes);
    from_root.send_confirmation(root);
    from_root.run();
    return;
  }
  CollectiveStep& to_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root) continue;
    to_all.send(peer, inputs[peer], bytes);
    to_all.expect_confirmation(peer);
  }
  to_all.run();
  // The root copies its own part once its sends are complete (a send is,
  // once the ring or the socket holds its bytes, not once they are read),
  // so that its copy overlaps the receivers' copies out of the rings,
  // where copying it first held the sends back (bench/README.md, "The
  // scatter root's own part").
  copy_own_part(inputs[root], output, bytes);
}

}  // namespace comm::tcp::algorithms
