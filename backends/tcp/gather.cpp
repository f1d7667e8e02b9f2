// gather: every rank sends straight to the root, which receives from all
// at once. The root confirms to each rank, once it has received its block,
// that it is in the same call, which the rank reads up to a window of calls
// later (CollectiveStep::expect_confirmation). Without it ranks that name
// different roots could all only send and return success; with it each
// reads a header naming another root and fails with MismatchError, in this
// call or one of the next few, while a rank that arrives before the root
// does not wait for it.
//
// A group spanning hosts runs the same: each block travels once, straight
// to the root over its sender's own link; gathering a host's blocks at a
// leader first would add a hop and a copy to save messages, not bytes.
//
// Where every rank is on this host and may read the others' memory, and
// the n blocks hold COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES or more, the root
// reads every block from its rank's memory (single_copy.h): each rank sends the
// root its input's address and size, and waits until the root says it has read
// it. A rank that names another root sends it a message whose header says
// so, or waits for a root that answers it is in another call:
// MismatchError.
#include <cstring>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {

void gather(CollectiveTransport& ctx, const void* input,
            std::span<void* const> outputs, std::size_t bytes, int root) {
  const Buffers buffers =
      buffers_of(outputs, bytes) & buffers_of({{input, bytes}});
  if (PeerMemory* memory = direct_memory(
          ctx, judged_bytes(bytes, ctx.size(), buffers), DirectKind::kToRoot,
          AtTwoRanks::kReadDirectly, buffers)) {
    const Offer offer(*memory);
    if (ctx.rank() != root) {
      lend_to(ctx, root, region_of(input, bytes));
      return;
    }
    const std::vector<int> others = peers(ctx);
    const auto theirs = trade_regions(ctx, {}, {}, others, 1);
    for (int peer : others) check_bytes(ctx, peer, theirs[peer][0], bytes);
    if (bytes > 0 && outputs[root] != input)
      std::memmove(outputs[root], input, bytes);
    for (int peer : others) {
      memory->read(peer, theirs[peer][0], 0, outputs[peer], bytes);
    }
    memory->confirm(others);
    signal(ctx, others, {});
    return;
  }
  if (ctx.rank() != root) {
    CollectiveStep& to_root = ctx.step();
    to_root.send(root, input, bytes);
    to_root.expect_confirmation(root);
    to_root.run();
    return;
  }
  if (bytes > 0 && outputs[root] != input)
    std::memmove(outputs[root], input, bytes);
  CollectiveStep& from_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root) continue;
    from_all.recv(peer, outputs[peer], bytes);
    from_all.send_confirmation(peer);
  }
  from_all.run();
}

}  // namespace comm::tcp::algorithms
