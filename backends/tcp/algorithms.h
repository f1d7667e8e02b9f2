// comm::tcp::algorithms: the collective algorithms, one per file, written
// against CollectiveTransport and CollectiveStep only, so that any CPU
// transport can run them. Buffers are host memory; sizes are bytes except
// where a count of elements is named.
//
// The namespace keeps them apart from the reduction kernel comm::reduce and
// from Backend::reduce; call them qualified (algorithms::reduce).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <span>
#include <vector>

#include "backends/collective_transport.h"
#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"

namespace comm::tcp::algorithms {

void broadcast(CollectiveTransport& ctx, void* data, std::size_t bytes,
               int root);
void reduce(CollectiveTransport& ctx, void* data, std::size_t count,
            DType dtype, ReduceOp op, int root);
// `output` becomes op over every rank's `input`; the two are the same
// memory (in place) or apart.
void all_reduce(CollectiveTransport& ctx, const void* input, void* output,
                std::size_t count, DType dtype, ReduceOp op);
void all_gather(CollectiveTransport& ctx, std::span<void* const> blocks,
                std::size_t bytes);
void gather(CollectiveTransport& ctx, const void* input,
            std::span<void* const> outputs, std::size_t bytes, int root);
void scatter(CollectiveTransport& ctx, std::span<const void* const> inputs,
             void* output, std::size_t bytes, int root);
void reduce_scatter(CollectiveTransport& ctx,
                    std::span<const void* const> inputs, void* output,
                    std::size_t count, DType dtype, ReduceOp op);
// Sends input[send_offsets[p], + send_bytes[p]) to each rank p and receives
// rank p's part into output[recv_offsets[p], + recv_bytes[p]).
// `callers_input`, where given, is the buffer `input` copies (an all_to_all
// in place sends from a copy): whether a rank reads its peers directly is
// judged by the caller's buffers (single_copy.h, Buffers), so that the
// copy does not make it choose otherwise than its peers.
void all_to_all(CollectiveTransport& ctx, const std::uint8_t* input,
                std::span<const std::size_t> send_offsets,
                std::span<const std::size_t> send_bytes, std::uint8_t* output,
                std::span<const std::size_t> recv_offsets,
                std::span<const std::size_t> recv_bytes,
                const void* callers_input = nullptr);
void barrier(CollectiveTransport& ctx);

// The largest all_reduce (bytes) that uses recursive doubling at
// `world_size` ranks; larger ones use the ring. COMM_TCP_RING_THRESHOLD_BYTES
// sets it for every world size; the defaults (1 MiB at world 2, where both
// algorithms move each byte once each way and recursive doubling does it in
// one exchange; 64 KiB otherwise, where recursive doubling sends the whole
// message log2(n) times) were measured, see bench/README.md ("The TCP
// backend's tuning"). It also bounds the scratch memory of a small
// all_reduce: recursive doubling's scratch is one message.
std::size_t ring_threshold_bytes(int world_size);

// The ring all_reduce's reduce-scatter half, in place: leaves this rank
// with segment_of(count, size, rank + 1 mod size) of `data` (count
// elements) reduced over every rank, and the rest of `data` partly
// reduced. Needs count >= size.
void ring_reduce_scatter(CollectiveTransport& ctx, void* data,
                         std::size_t count, DType dtype, ReduceOp op);

// Whether an all_gather, reduce_scatter or all_to_all in which this rank
// sends `bytes_sent` in all exchanges with every peer at once, in one step
// whose latency is one message's, rather than in the n - 1 steps of a ring
// or of pairwise exchange, each waiting for the one before. Direct steps
// send as many bytes, but n - 1 messages land on each rank at once, and
// reduce_scatter holds the n - 1 received blocks before it reduces them, so
// only messages up to COMM_TCP_DIRECT_THRESHOLD_BYTES go direct. At two
// ranks both are the same single step; this says no.
bool exchange_directly(const CollectiveTransport& ctx, std::size_t bytes_sent);

// Whether a small all_gather or reduce_scatter that exchange_directly()
// lets go in one step runs log2 n steps of exchanges between pairs instead
// (recursive doubling, recursive halving): among a power of two of ranks,
// four or more, each rank then receives log2 n messages instead of n - 1,
// and each message costs its receiver a wake-up.
bool exchange_in_pairs(const CollectiveTransport& ctx);

// A rank's place in the binomial tree of broadcast, reduce and a small
// scatter, rooted at `root` among `size` ranks and numbered by the highest
// bit relative to the root: a rank's parent is the rank less its highest
// bit, its children the rank plus each power of two from `first_power` on
// (0 sends to 1, 2, 4; 1 to 3, 5; 2 to 6), the largest subtree first, and
// its subtree every rank congruent to it modulo `first_power` (at eight
// ranks 1's is {1, 3, 5, 7}). So the ranks that send alternate between odd
// and even, and ranks placed on a host's CPUs in turn (rank r on CPU r mod
// c, as the bench and mpirun bind them) share a call's sends between the
// CPUs; over loopback TCP a send also carries the receiver's protocol work.
struct BinomialTree {
  BinomialTree(int rank, int ranks, int root_rank)
      : size(ranks),
        root(root_rank),
        relative((rank - root_rank + ranks) % ranks),
        parent(relative > 0 ? relative - highest_bit(relative) : -1),
        first_power(relative > 0 ? highest_bit(relative) << 1 : 1) {}

  // The group rank of relative rank `r`.
  int real(int r) const { return (r + root) % size; }

  const int size;
  const int root;
  const int relative;     // this rank, relative to the root
  const int parent;       // relative; -1 at the root
  const int first_power;  // of the first child, and the subtree's stride

 private:
  static int highest_bit(int r) {
    return static_cast<int>(std::bit_floor(static_cast<unsigned>(r)));
  }
};

// Appends the `bytes` at `data` to `parts`, joined to the last part where
// they follow it in memory, so that adjacent blocks travel as one part.
void append_part(std::pmr::vector<CollectiveStep::Part>& parts,
                 std::uint8_t* data, std::size_t bytes);

}  // namespace comm::tcp::algorithms
