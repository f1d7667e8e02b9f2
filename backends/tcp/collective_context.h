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

  int rank() const { return mesh.rank(); }
  int size() const { return mesh.size(); }
  Exchange step() { return Exchange(mesh, call, deadline, wake_fd); }
  void run(Exchange& exchange) { exchange.run(); }
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

// The largest all_reduce (bytes) that uses recursive doubling at
// `world_size` ranks; larger ones use the ring. COMM_TCP_RING_THRESHOLD_BYTES
// sets it for every world size; the defaults were measured on 2-core
// machines with bench/compare and alternating runs of one size.
//
// World 2: 1 MiB. Both algorithms move each byte once each way there, and
// recursive doubling does it in one exchange, where the ring's stream
// waits for each chunk to be reduced before it relays it: medians of 8
// runs, 256 KiB 84 us against 119, 1 MiB 306 against 430 (Open MPI 286);
// at 2 MiB they were even, at 4 MiB the ring won (1672 against 2108).
// Other worlds: 64 KiB. Recursive doubling sends the whole message log2(n)
// times, the ring 2(n-1)/n times: at 64 KiB its fewer rounds still win
// (world 4: 45-78 us against 46-169), at 256 KiB the ring does (355
// against 400). On one earlier machine, recursive doubling at 96 KiB took
// three times as long as the ring at world 2, when a whole message did not
// fit a fresh loopback connection's receive window; runs on later ones did
// not show it, even on fresh connections, so measure before lowering a
// threshold. Recursive doubling's scratch is one message, so this also
// bounds the scratch memory of a small all_reduce.
std::size_t ring_threshold_bytes(int world_size);

}  // namespace comm::tcp
