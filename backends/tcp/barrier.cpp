// barrier: dissemination; in round k every rank signals rank + 2^k and
// waits for rank - 2^k, so after ceil(log2 n) rounds each rank has heard,
// directly or through others, from all.
#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void barrier(CollectiveTransport& ctx) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  for (int distance = 1; distance < size; distance <<= 1) {
    CollectiveStep& round = ctx.step();
    round.send((rank + distance) % size, nullptr, 0);
    round.recv((rank - distance + size) % size, nullptr, 0);
    round.run();
  }
}

}  // namespace comm::tcp::algorithms
