// all_to_all: small messages go directly, every send and receive in one
// step. Larger ones run pairwise exchange: in step k each rank sends to
// rank + k and receives from rank - k, so every pair meets once and no rank
// is swamped.
//
// A group spanning hosts runs the same: every message goes straight from
// its sender to its receiver over that pair's own link (shared memory or
// TCP), so each byte that must cross the network crosses it once, and no
// order of the ranks changes that. A two-level exchange would send fewer,
// larger messages between hosts at the cost of a copy in and out of each
// leader.
#include <cstring>

#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void all_to_all(CollectiveTransport& ctx, const std::uint8_t* input,
                const std::vector<std::size_t>& send_offsets,
                const std::vector<std::size_t>& send_bytes,
                std::uint8_t* output,
                const std::vector<std::size_t>& recv_offsets,
                const std::vector<std::size_t>& recv_bytes) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  if (send_bytes[rank] > 0) {
    std::memmove(output + recv_offsets[rank], input + send_offsets[rank],
                 send_bytes[rank]);
  }
  std::size_t bytes_sent = 0;
  for (int p = 0; p < size; ++p) {
    if (p != rank) bytes_sent += send_bytes[p];
  }
  if (exchange_directly(ctx, bytes_sent)) {
    CollectiveStep& step = ctx.step();
    for (int k = 1; k < size; ++k) {
      const int to = (rank + k) % size;
      const int from = (rank - k + size) % size;
      step.send(to, input + send_offsets[to], send_bytes[to]);
      step.recv(from, output + recv_offsets[from], recv_bytes[from]);
    }
    step.run();
    return;
  }
  for (int k = 1; k < size; ++k) {
    const int to = (rank + k) % size;
    const int from = (rank - k + size) % size;
    CollectiveStep& step = ctx.step();
    step.send(to, input + send_offsets[to], send_bytes[to]);
    step.recv(from, output + recv_offsets[from], recv_bytes[from]);
    step.run();
  }
}

}  // namespace comm::tcp::algorithms
