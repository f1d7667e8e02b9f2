// What an algorithm of the TCP backend works with: the mesh, the call it
// runs (stamped on every message), its deadline, and the backend's wake-up
// descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/message_header.h"

namespace comm::tcp {

struct CollectiveContext {
  Mesh& mesh;
  CallInfo call;
  detail::Clock::time_point deadline;
  int wake_fd = -1;
  // Set when the failure being thrown was reported by a peer.
  bool relayed = false;

  int rank() const { return mesh.rank(); }
  int size() const { return mesh.size(); }
  Exchange step() { return Exchange(mesh, call, deadline, wake_fd); }
  void run(Exchange& exchange) {
    try {
      exchange.run();
    } catch (...) {
      relayed = exchange.relayed();
      throw;
    }
  }
};

// The algorithms, one per file. Buffers are host memory; sizes are bytes
// except where a count of elements is named.
void broadcast(CollectiveContext& ctx, void* data, std::size_t bytes, int root);
void reduce(CollectiveContext& ctx, void* data, std::size_t count, DType dtype,
            ReduceOp op, int root);
// `output` becomes op over every rank's `input`; the two are the same
// memory (in place) or apart.
void all_reduce(CollectiveContext& ctx, const void* input, void* output,
                std::size_t count, DType dtype, ReduceOp op);
void all_gather(CollectiveContext& ctx, const std::vector<void*>& blocks,
                std::size_t bytes);
void gather(CollectiveContext& ctx, const void* input,
            const std::vector<void*>& outputs, std::size_t bytes, int root);
void scatter(CollectiveContext& ctx, const std::vector<const void*>& inputs,
             void* output, std::size_t bytes, int root);
void reduce_scatter(CollectiveContext& ctx,
                    const std::vector<const void*>& inputs, void* output,
                    std::size_t count, DType dtype, ReduceOp op);
// Sends input[send_offsets[p], + send_bytes[p]) to each rank p and receives
// rank p's part into output[recv_offsets[p], + recv_bytes[p]).
void all_to_all(CollectiveContext& ctx, const std::uint8_t* input,
                const std::vector<std::size_t>& send_offsets,
                const std::vector<std::size_t>& send_bytes,
                std::uint8_t* output,
                const std::vector<std::size_t>& recv_offsets,
                const std::vector<std::size_t>& recv_bytes);
void barrier(CollectiveContext& ctx);

// The largest all_reduce (bytes) that uses recursive doubling; larger ones
// use the ring: COMM_TCP_RING_THRESHOLD_BYTES, or the default (64 KiB)
// measured on the test machine. At 64 KiB recursive doubling's log2(n)
// rounds beat the ring's 2(n-1) hops (world 4: 45-78 us against 46-169;
// the ring suffers most when the host makes cross-CPU traffic slow), and
// by 96 KiB a whole message no longer fits a loopback connection's initial
// receive window (tcp_rmem's 128 KiB): there it took three times as long
// as the ring's smaller, streamed segments.
std::size_t ring_threshold_bytes();

}  // namespace comm::tcp
