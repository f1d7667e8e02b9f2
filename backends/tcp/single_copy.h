// comm::tcp::algorithms, single copy: what the collectives' direct
// algorithms share. Where every rank of the group is on this host and may
// read the others' memory (CollectiveTransport::peer_memory()), a large
// collective reads each peer's buffer where it lies instead of streaming it
// through the shared-memory rings, so each byte is copied once, by its
// reader, where the rings copy it in and out at every step of a ring or a
// tree.
//
// The pattern, in each collective's file beside its other algorithms:
//   0. the rank offers its buffers (Offer) for as long as it is in the
//      algorithm, so that a peer's read fails once it left, whatever way;
//   1. a step trades Regions (address and size, and the block of shared
//      host memory that holds the buffer, if one does) over the rings, in
//      messages marked as addresses (CollectiveStep::send_address; all_to_all
//      sends them beside the parts that travel); the messages carry the
//      call's header, so a rank in another call is a MismatchError, and
//      so is a rank that receives on the rings' algorithm where its peers
//      read (its COMM_SHM_DIRECT_* settings, or its kind of memory, differ
//      from theirs), which
//      would otherwise take a region of the same length for data; each
//      region's size is checked against what the reader expects
//      (check_bytes), so that ranks that disagree on a size fail instead
//      of reading out of bounds;
//   2. each rank reads what it needs (PeerMemory::read), reducing a chunk
//      at a time where the collective reduces (reduce_from_peers: scratch
//      of two chunks, chunk_bytes() each, kept by the transport), and
//      confirms that each peer it read still offers its buffers (confirm),
//      before it tells anyone it is done: only then is what it read the
//      peer's data;
//   3. a step of empty messages (signal) tells each rank whose buffer was
//      read that its readers are done, so that no rank returns, and lets
//      its caller reuse a buffer, while a peer may still read it.
// A peer that dies is a PeerError naming it, from its pidfd while a step
// waits or from the failed read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "backends/collective_transport.h"
#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"

namespace comm::tcp::algorithms {

// The direct algorithms, by the threshold each answers to.
enum class DirectKind {
  // all_reduce, all_gather, reduce_scatter and all_to_all, in which every
  // rank reads from every peer: COMM_SHM_DIRECT_THRESHOLD_BYTES.
  kAmongAll,
  // broadcast and scatter, in which every rank reads from the root:
  // COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES. Over the rings the root
  // copies in while the others copy out, on all their cores at once; a
  // direct read is one core copying lines that the root's core holds, which
  // is slow where the root has just written them.
  kFromRoot,
  // gather and reduce: COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES. A direct
  // gather's root copies every block itself, where over the rings each
  // sender copies its own in, in parallel; the direct reduce (a
  // reduce-scatter whose slices the root then reads) adds a step to the
  // tree's one message (bench/README.md, "Single copy", has the figures).
  kToRoot,
};

// Whether a collective reads directly at all when its group has two
// ranks. Where two ranks' rings take as few steps as the direct algorithm
// (broadcast's tree and scatter: one message; all_reduce's and
// reduce_scatter's ring: one exchange each way per half; all_gather and
// all_to_all: one exchange), the ring copies on both cores at once, while
// a direct read adds the kernel's copy, which pins every page it reads,
// and the algorithm's synchronisation steps. Which wins depends on how
// fast the host's kernel copies (bench/README.md, "Single copy at two
// ranks"): all_reduce, reduce_scatter and broadcast keep the rings at two
// ranks on every host measured; all_gather, all_to_all and scatter read
// directly where the kernel's copy keeps up (PeerMemory::
// kernel_copy_keeps_up), from COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES
// (scatter: COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES), as the
// rings then copy each byte of the peer's block twice where one copy would
// do. gather and reduce answer to their own threshold and read
// directly at two ranks too.
enum class AtTwoRanks {
  kReadDirectly,
  kKeepRings,
  kReadWhereKernelCopyKeepsUp,
};

// Whether a call's buffers all lie in shared host memory
// (libcomm/shared_host_memory.h), which its peers read through mappings
// with a plain copy, from COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES on
// (gather and scatter: each part, judged_bytes), whatever the group's
// size. Each rank judges its own buffers: the ranks of a call agree only
// where every rank's buffers are shared or none are, and a rank that reads
// where its peers stream (or the reverse) is a MismatchError naming the
// call (see the pattern above). Where the reading rank first waits for a
// confirmation that a streaming peer owes it (broadcast.cpp), and that
// peer's step sends nothing to the reader, the error comes after about
// 100 ms, once the peer's step has waited that long and sends what it owes
// (Exchange::send_owed_while_stalled).
enum class Buffers { kOrdinary, kShared };
// kShared when every (address, bytes) in `buffers` lies in one block of
// shared host memory, kOrdinary otherwise.
Buffers buffers_of(
    std::initializer_list<std::pair<const void*, std::size_t>> buffers);
// kShared when each of `buffers` holds `bytes` in shared host memory.
template <typename Pointer>
Buffers buffers_of(std::span<Pointer const> buffers, std::size_t bytes) {
  for (const void* data : buffers) {
    if (!find_shared_host(data, bytes)) return Buffers::kOrdinary;
  }
  return Buffers::kShared;
}
// kShared when both are.
inline Buffers operator&(Buffers a, Buffers b) {
  return a == Buffers::kShared && b == Buffers::kShared ? Buffers::kShared
                                                        : Buffers::kOrdinary;
}
// `buffers` for a collective whose rings run a binomial tree (broadcast,
// reduce): shared memory counts only where that tree is flat, at three
// ranks or fewer. In a deeper tree, a rank whose memory differed from its
// peers' would wait for a tree parent that reads directly and so never
// sends to it; no message would carry a mark to show the mismatch, and the
// call would end only at its timeout, blaming that parent.
inline Buffers in_flat_tree(const CollectiveTransport& ctx, Buffers buffers) {
  return ctx.size() <= 3 ? buffers : Buffers::kOrdinary;
}
// The bytes by which gather and scatter, of `size` parts of `part_bytes`,
// choose: all n parts against the ordinary thresholds, one part against
// the shared one. Their root meets every reader in turn, so that the
// synchronisation grows with n where the copying per reader does not
// (bench/README.md, "Shared host memory").
inline std::size_t judged_bytes(std::size_t part_bytes, int size,
                                Buffers buffers) {
  return buffers == Buffers::kShared
             ? part_bytes
             : part_bytes * static_cast<std::size_t>(size);
}

// The smallest collective of `kind` that reads the peers' `memory` in a
// group of `size` ranks, in the bytes each collective's file names: with
// Buffers::kShared, COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES; at two ranks
// with kReadWhereKernelCopyKeepsUp,
// COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES (kFromRoot:
// COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES); otherwise the
// kind's threshold, which for kAmongAll, unless set, is 1 MiB where the
// kernel's copy keeps up and 64 MiB where it does not (bench/README.md,
// "Single copy at two ranks" and "Single copy").
std::size_t direct_threshold_bytes(const PeerMemory& memory, DirectKind kind,
                                   int size, AtTwoRanks at_two_ranks,
                                   Buffers buffers);

// The peers' memory where a collective may read it at all, whatever its
// size: every rank of the group can read every other's, and the group has
// more than one rank (with Buffers::kOrdinary, more than two with
// AtTwoRanks::kKeepRings, and with kReadWhereKernelCopyKeepsUp where the
// kernel's copy does not keep up). Null otherwise. Every rank of the group
// gets the same answer for the same `buffers`. all_to_all, which judges
// each part's size on its own, asks this.
PeerMemory* readable_memory(CollectiveTransport& ctx, AtTwoRanks at_two_ranks,
                            Buffers buffers);

// The peers' memory when a collective of `kind` and `bytes` reads it
// directly: readable_memory(), and `bytes` reaches
// direct_threshold_bytes() at the group's size. Null otherwise. Every rank
// that makes the same call with the same `buffers` gets the same answer.
PeerMemory* direct_memory(CollectiveTransport& ctx, std::size_t bytes,
                          DirectKind kind, AtTwoRanks at_two_ranks,
                          Buffers buffers);

// Offers this rank's buffers (PeerMemory::offer) while it lives: made
// before the first address is sent, it withdraws them on every way out of
// the algorithm, before the caller may free or rewrite them.
class Offer {
 public:
  explicit Offer(PeerMemory& memory) : memory_(memory) { memory_.offer(); }
  ~Offer() { memory_.withdraw(); }
  Offer(const Offer&) = delete;
  Offer& operator=(const Offer&) = delete;

 private:
  PeerMemory& memory_;
};

// Where a buffer lies in the rank that owns it, as traded in a step.
using Region = PeerRegion;
Region region_of(const void* data, std::size_t bytes);
// The part of `region` from `offset` bytes on.
Region part_from(Region region, std::uint64_t offset);

// Every rank of the group but this one, from rank + 1 on, wrapping
// around: ranks that read their peers one after another in this order each
// start at a different peer, where in rank order all but rank 0 would read
// rank 0 first, pinning its pages and walking its page tables at once,
// then rank 1's (bench/README.md, "Staggered reads").
std::vector<int> peers(const CollectiveTransport& ctx);

// One step: sends each peer in `to` the message outgoing[peer] (regions,
// indexed by rank) and receives from each peer in `from` a message of
// `each` regions, all marked as addresses; returns those, indexed by rank
// (empty for the others).
std::vector<std::vector<Region>> trade_regions(
    CollectiveTransport& ctx, const std::vector<int>& to,
    const std::vector<std::vector<Region>>& outgoing,
    const std::vector<int>& from, std::size_t each);

// How a rank that only lends its buffer takes part (gather's and reduce's
// non-roots): sends `region` to `reader` in a step of its own, then waits
// for the reader's "done", after which the reader no longer reads it. The
// caller holds its Offer for the whole call.
void lend_to(CollectiveTransport& ctx, int reader, const Region& region);

// Throws MismatchError, naming the call and both ranks, unless the region
// that `peer` offered holds `expected` bytes.
void check_bytes(const CollectiveTransport& ctx, int peer,
                 const Region& offered, std::size_t expected);

// One step of empty messages (headers alone): one to each peer in `to`, one
// from each peer in `from`.
void signal(CollectiveTransport& ctx, const std::vector<int>& to,
            const std::vector<int>& from);

// The elements [begin, end) of segment `i` of `count` elements cut into
// `parts` segments, the first count % parts of them one element longer:
// the ring all_reduce's segments, and the single-copy one's slices.
struct Segment {
  std::size_t begin = 0;
  std::size_t end = 0;
};
Segment segment_of(std::size_t count, int parts, int i);

// Reads from each peer p in `from` its own slice, segment_of(count, parts,
// p), of the buffer that lies in buffers[p] in its memory, into the same
// slice of `data`: how a rank collects the slices its peers reduced.
// `element` is the size of one element; the reads are confirmed by the
// caller.
void read_slices(PeerMemory& memory, const std::vector<int>& from,
                 const std::vector<Region>& buffers, std::uint8_t* data,
                 std::size_t count, int parts, std::size_t element);

// output = op over every rank's operand, in rank order 0..n-1, so that
// the result is the same bits whichever rank computes it. Rank p's operand
// lies in operands[p] in its memory, this rank's at `own`, which may be
// `output` (each chunk is read before its result is written). `count`
// elements, reduced a chunk at a time, from where a peer's operand is
// mapped (PeerMemory::mapped) or else from a read of it; the reads are
// confirmed by the caller.
void reduce_from_peers(CollectiveTransport& ctx, PeerMemory& memory,
                       const std::vector<Region>& operands,
                       const std::uint8_t* own, std::uint8_t* output,
                       std::size_t count, DType dtype, ReduceOp op);

}  // namespace comm::tcp::algorithms
