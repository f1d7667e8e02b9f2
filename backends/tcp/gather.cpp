// gather: every rank sends straight to the root, which receives from all
// at once.
#include <cstring>

#include "backends/tcp/collective_context.h"

namespace comm::tcp {

void gather(CollectiveContext& ctx, const void* input,
            const std::vector<void*>& outputs, std::size_t bytes, int root) {
  if (ctx.rank() != root) {
    Exchange to_root = ctx.step();
    to_root.send(root, input, bytes);
    ctx.run(to_root);
    return;
  }
  if (bytes > 0 && outputs[root] != input)
    std::memmove(outputs[root], input, bytes);
  Exchange from_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer != root) from_all.recv(peer, outputs[peer], bytes);
  }
  ctx.run(from_all);
}

}  // namespace comm::tcp
