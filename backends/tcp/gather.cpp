// gather: every rank sends straight to the root, which receives from all
// at once. The root sends each rank an empty message (a header alone) as
// it starts: a confirmation that the root is in the same call. Without it
// ranks that name different roots could all only send, and nobody would
// notice; with it each reads a header naming another root and fails with
// MismatchError. A rank reads its confirmation after the call
// (recv_confirmation), as its next collective begins, so it does not wait
// for the root to arrive.
//
// A group spanning hosts runs the same: each block travels once, straight
// to the root over its sender's own link; gathering a host's blocks at a
// leader first would add a hop and a copy to save messages, not bytes.
#include <cstring>

#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void gather(CollectiveTransport& ctx, const void* input,
            const std::vector<void*>& outputs, std::size_t bytes, int root) {
  if (ctx.rank() != root) {
    CollectiveStep& to_root = ctx.step();
    to_root.send(root, input, bytes);
    to_root.recv_confirmation(root);
    to_root.run();
    return;
  }
  if (bytes > 0 && outputs[root] != input)
    std::memmove(outputs[root], input, bytes);
  CollectiveStep& from_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root) continue;
    from_all.recv(peer, outputs[peer], bytes);
    from_all.send(peer, nullptr, 0);
  }
  from_all.run();
}

}  // namespace comm::tcp::algorithms
