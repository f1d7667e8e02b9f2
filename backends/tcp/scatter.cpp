// scatter: the root sends each rank its part directly, to all at once.
// Each rank confirms with an empty message (a header alone) that it is in
// the same call: ranks that name different roots then read a header naming
// another root and fail with MismatchError, instead of some only sending
// and nobody noticing (see broadcast.cpp). The root reads the
// confirmations after the call (recv_confirmation), as its next collective
// begins, so it does not wait for the last rank to arrive.
//
// A group spanning hosts runs the same: each block travels once, straight
// from the root over its receiver's own link; relaying a host's blocks
// through a leader would add a hop and a copy to save messages, not bytes.
#include <cstring>

#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void scatter(CollectiveTransport& ctx, const std::vector<const void*>& inputs,
             void* output, std::size_t bytes, int root) {
  if (ctx.rank() != root) {
    CollectiveStep& from_root = ctx.step();
    from_root.recv(root, output, bytes);
    from_root.send(root, nullptr, 0);
    from_root.run();
    return;
  }
  if (bytes > 0 && inputs[root] != output)
    std::memmove(output, inputs[root], bytes);
  CollectiveStep& to_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root) continue;
    to_all.send(peer, inputs[peer], bytes);
    to_all.recv_confirmation(peer);
  }
  to_all.run();
}

}  // namespace comm::tcp::algorithms
