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
//
// Where every rank is on this host and may read the others' memory (at
// two ranks, only where the kernel's copy keeps up: single_copy.h), each
// pair of ranks decides, for each direction, on the part's size alone
// (both ends know it): a part of COMM_SHM_DIRECT_THRESHOLD_BYTES / n
// (at two ranks, COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES / 2), rounded
// up, or more (n such parts reach the threshold; where the input and the
// output lie in shared host memory, COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES
// / n at any size of group) is read by its receiver from the sender's
// input where it lies (single_copy.h), a smaller one travels over the
// ring. In one step every rank sends each peer either its
// part or, for a part that is read, its Region (address and size) in a
// message marked as an address (CollectiveStep::send_address). Ranks whose
// splits disagree fail with MismatchError: where the two ends disagree on
// whether the part travels, the message's mark does not match the
// receive; where both read, the Region's size does not match. A rank none
// of whose parts is read sends what the plain algorithm (a direct step, or
// pairwise steps) sends, and runs it: no offer, no addresses, no last
// step. Each rank that reads then reads its large parts, and a last step
// tells each sender whose part was read that its reader is done, so that
// no rank returns while a peer still reads its input (the backend gives
// an input that overlaps the output a copy of its own, as for the other
// algorithms).
//
// So with uneven splits, ranks of one call may run different algorithms:
// one rank a direct step, another pairwise steps or a read. Each pair of
// ranks still trades the same messages, which every algorithm sends
// without waiting on any other peer, but a rank that owes a peer a
// confirmation (broadcast.cpp) sends it in a step that sends to that peer
// (or once a step of its has waited 100 ms for anyone, exchange.h), while
// the peer reads it before anything else it receives from the rank. The
// direct step and the reads' first step send to every peer, and so send
// every confirmation owed; pairwise steps do not, so their first sends
// them all (CollectiveStep::send_owed_confirmations) rather than wait.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {
namespace {

// The smallest part a receiver reads from its sender's memory in a group
// of `size`: a part is judged as one of n equal ones, read when n parts of
// its size would reach the threshold, as the other collectives judge their
// whole buffers.
std::size_t read_threshold(const PeerMemory& memory, int size,
                           Buffers buffers) {
  const auto n = static_cast<std::size_t>(size);
  const std::size_t threshold =
      direct_threshold_bytes(memory, DirectKind::kAmongAll, size,
                             AtTwoRanks::kReadWhereKernelCopyKeepsUp, buffers);
  return std::max<std::size_t>(1, (threshold + n - 1) / n);
}

// The bytes from a buffer's start to the end of its last part.
std::size_t extent(std::span<const std::size_t> offsets,
                   std::span<const std::size_t> bytes) {
  std::size_t end = 0;
  for (std::size_t p = 0; p < offsets.size(); ++p) {
    end = std::max(end, offsets[p] + bytes[p]);
  }
  return end;
}

void read_directly(CollectiveTransport& ctx, PeerMemory& memory,
                   std::size_t threshold, const std::uint8_t* input,
                   std::span<const std::size_t> send_offsets,
                   std::span<const std::size_t> send_bytes,
                   std::uint8_t* output,
                   std::span<const std::size_t> recv_offsets,
                   std::span<const std::size_t> recv_bytes) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  const Offer offer(memory);
  auto read = [&](std::size_t bytes) { return bytes >= threshold; };
  // What this rank tells each peer, then what each peer tells it.
  std::vector<Region> regions(2 * static_cast<std::size_t>(size));
  Region* const offered = regions.data();
  Region* const told = offered + size;
  CollectiveStep& step = ctx.step();
  for (int k = 1; k < size; ++k) {
    const int to = (rank + k) % size;
    const int from = (rank - k + size) % size;
    if (read(send_bytes[to])) {
      offered[to] = region_of(input + send_offsets[to], send_bytes[to]);
      step.send_address(to, &offered[to], sizeof(Region));
    } else {
      step.send(to, input + send_offsets[to], send_bytes[to]);
    }
    if (read(recv_bytes[from])) {
      step.recv_address(from, &told[from], sizeof(Region));
    } else {
      step.recv(from, output + recv_offsets[from], recv_bytes[from]);
    }
  }
  step.run();
  // Read from rank + 1 on, as peers() orders them, so that the readers
  // of a peer's input do not all start with rank 0's.
  std::vector<int> read_from, read_by;
  for (int k = 1; k < size; ++k) {
    const int peer = (rank + k) % size;
    if (read(recv_bytes[peer])) {
      check_bytes(ctx, peer, told[peer], recv_bytes[peer]);
      read_from.push_back(peer);
    }
    if (read(send_bytes[peer])) read_by.push_back(peer);
  }
  for (int peer : read_from) {
    memory.read(peer, told[peer], 0, output + recv_offsets[peer],
                recv_bytes[peer]);
  }
  memory.confirm(read_from);
  signal(ctx, read_from, read_by);
}

}  // namespace

void all_to_all(CollectiveTransport& ctx, const std::uint8_t* input,
                std::span<const std::size_t> send_offsets,
                std::span<const std::size_t> send_bytes, std::uint8_t* output,
                std::span<const std::size_t> recv_offsets,
                std::span<const std::size_t> recv_bytes,
                const void* callers_input) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  if (send_bytes[rank] > 0) {
    std::memmove(output + recv_offsets[rank], input + send_offsets[rank],
                 send_bytes[rank]);
  }
  const Buffers buffers =
      buffers_of({{callers_input != nullptr ? callers_input : input,
                   extent(send_offsets, send_bytes)},
                  {output, extent(recv_offsets, recv_bytes)}});
  if (PeerMemory* memory = readable_memory(
          ctx, AtTwoRanks::kReadWhereKernelCopyKeepsUp, buffers)) {
    const std::size_t threshold = read_threshold(*memory, size, buffers);
    bool reads = false;
    for (int p = 0; p < size; ++p) {
      if (p != rank &&
          (send_bytes[p] >= threshold || recv_bytes[p] >= threshold)) {
        reads = true;
      }
    }
    if (reads) {
      read_directly(ctx, *memory, threshold, input, send_offsets, send_bytes,
                    output, recv_offsets, recv_bytes);
      return;
    }
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
    if (k == 1) step.send_owed_confirmations();
    step.send(to, input + send_offsets[to], send_bytes[to]);
    step.recv(from, output + recv_offsets[from], recv_bytes[from]);
    step.run();
  }
}

}  // namespace comm::tcp::algorithms
