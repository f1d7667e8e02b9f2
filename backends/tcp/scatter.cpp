// scatter: the root sends each rank its part directly, to all at once.
// Each rank confirms to the root, once it has its part, that it is in the
// same call, which the root reads a few calls later: ranks that name different
// roots then read a header naming another root and fail with MismatchError,
// instead of some only sending and returning success (see broadcast.cpp).
//
// A group spanning hosts runs the same: each block travels once, straight
// from the root over its receiver's own link; relaying a host's blocks
// through a leader would add a hop and a copy to save messages, not bytes.
//
// Where every rank is on this host and may read the others' memory, and
// the n parts hold COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES or more, each rank
// reads its part from the root's memory (single_copy.h): the root sends each
// rank its part's address and size, and returns once every rank has said it has
// read it.
#include <cstring>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {

void scatter(CollectiveTransport& ctx, std::span<const void* const> inputs,
             void* output, std::size_t bytes, int root) {
  if (PeerMemory* memory =
          direct_memory(ctx, bytes * static_cast<std::size_t>(ctx.size()),
                        DirectKind::kFromRoot, AtTwoRanks::kReadDirectly)) {
    const Offer offer(*memory);
    if (ctx.rank() != root) {
      const auto theirs = trade_regions(ctx, {}, {}, {root}, 1);
      check_bytes(ctx, root, theirs[root][0], bytes);
      memory->read(root, theirs[root][0].address, output, bytes);
      memory->confirm({&root, 1});
      signal(ctx, {root}, {});
      return;
    }
    const std::vector<int> others = peers(ctx);
    std::vector<std::vector<Region>> mine(static_cast<std::size_t>(ctx.size()));
    for (int peer : others) mine[peer] = {region_of(inputs[peer], bytes)};
    trade_regions(ctx, others, mine, {}, 0);
    if (bytes > 0 && inputs[root] != output)
      std::memmove(output, inputs[root], bytes);
    signal(ctx, {}, others);
    return;
  }
  if (ctx.rank() != root) {
    CollectiveStep& from_root = ctx.step();
    from_root.recv(root, output, bytes);
    from_root.send_confirmation(root);
    from_root.run();
    return;
  }
  if (bytes > 0 && inputs[root] != output)
    std::memmove(output, inputs[root], bytes);
  CollectiveStep& to_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root) continue;
    to_all.send(peer, inputs[peer], bytes);
    to_all.expect_confirmation(peer);
  }
  to_all.run();
}

}  // namespace comm::tcp::algorithms
