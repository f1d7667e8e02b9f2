// all_reduce: recursive doubling for small messages (log2 rounds, each a
// full exchange with one partner), a chunked, pipelined ring for large ones
// (reduce-scatter then all-gather, 2(n-1) steps moving 1/n of the data
// each, run as one stream in which each chunk goes on as soon as the step
// before has produced it). Out of place, both read the input where it
// lies. Both give every rank bitwise the same result: each element's
// reduction is computed once by one rank (ring), or symmetrically by both
// partners of a commutative op (recursive doubling).
//
// Over a group spanning hosts (hierarchy.h), three phases, so that the
// network carries each host's share once instead of every rank's:
// - Large messages, every host with as many ranks (L): the ring's
//   reduce-scatter half among the ranks of each host (shared memory), which
//   leaves local rank i with segment i + 1 of L reduced over its host; an
//   all_reduce of that segment among the ranks of local index i, one per
//   host (TCP), each of the L running on 1/L of the message in parallel;
//   and the ring's all-gather half inside each host. Each host sends and
//   receives 2(H-1)/H of the message over the network for H hosts, in L
//   streams.
// - Small messages (up to the ring threshold at the group's size): a
//   binomial reduce inside each host to its lowest rank, an all_reduce
//   among those leaders, and a broadcast inside each host: log2(L) shared
//   memory steps on each side of log2(H) network rounds, in which one
//   rank per host sends, where the flat recursive doubling makes every
//   rank send over the network in as many rounds.
// - Large messages over hosts of different sizes: the flat ring, over the
//   ranks ordered host by host, so that it crosses from one host to the
//   next once. Each boundary then carries 2(n-1)/n of the message, about
//   the 2(H-1)/H a leader scheme's leaders would send, and the ring stays
//   one pipelined stream, where the leader scheme would reduce and
//   broadcast the whole message inside each host before and after.
// Each element's result is still computed once, by one all_reduce among
// the ranks that hold it (one of the L segment all_reduces, or the
// leaders'), which gives its participants the same bits; the phases inside
// hosts only copy them, so every rank ends with the same bits.
//
// Where every rank is on this host and may read the others' memory, a
// message of COMM_SHM_DIRECT_THRESHOLD_BYTES or more is read where it lies
// (single_copy.h), in three steps of small messages: the ranks trade the
// addresses of their input and output; each rank reduces its own slice
// (the ring's segment of its rank) from every rank's input, in rank order,
// into its output, a chunk at a time, and tells every peer its slice is
// ready; each rank then copies every other slice from the output of the
// rank that reduced it, and tells every peer it is done. One rank computes
// each element, so every rank holds the same bits.
//
// In place (a rank's input is its output) this is safe because of who
// reads what when. Before the "ready" step, rank q reads only slice q of
// every input, and writes only slice q of its own output: slice q of a
// rank's input is read by rank q alone, and rank q reads each chunk of
// its own before it writes that chunk's result (reduce_from_peers). A rank
// passes the "ready" step only once every rank has sent it, that is, once
// every rank has finished reading the inputs; only then does it write the
// other slices of its output, so no input is overwritten while a peer
// still reads it. After the step, rank q reads slice p of rank p's output,
// which rank p wrote before the step and does not write again (it writes
// only the other slices then). The "done" step keeps every rank in the
// call until no peer reads its buffers any more. Ranks may mix the two
// forms: each offers its input and its output, the same address or not.
//
// Two ranks keep the rings at every size, as they do for reduce_scatter.
// There the ring is one pipelined exchange, in which every byte is copied
// in user space, by its owner into a ring and by its reader out of it, on
// both cores at once, while the direct algorithm moves the peer's half
// with process_vm_readv, a kernel copy that pins every page it reads, and
// adds its three steps of synchronisation (bench/README.md, "Single
// copy"). From three ranks the ring needs 2(n - 1) steps, while the
// direct algorithm keeps its three.
#include <cstdint>
#include <limits>
#include <memory>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"
#include "libcomm/detail/copy_bytes.h"
#include "libcomm/optional_int_param.h"
#include "libcomm/reduce_kernels.h"

namespace comm::tcp::algorithms {
namespace {

const OptionalIntParam kRingThresholdBytes{
    "COMM_TCP_RING_THRESHOLD_BYTES", "1048576 at world size 2, else 65536", 0,
    std::numeric_limits<std::int64_t>::max(),
    "the largest all_reduce that uses recursive doubling instead of the ring"};

int mod(int a, int n) { return ((a % n) + n) % n; }

// `input` may be `data` (in place). Each round sends the running result
// as it stood before the round, reading the input where it lies in round
// one, and no copy is made to keep the outgoing bytes stable: a round
// that sends `data` receives the partner's into scratch and reduces once
// the send is done; one that does not (round one, out of place) reduces
// into `data` chunk by chunk as the partner's arrives.
void recursive_doubling(CollectiveTransport& ctx, const std::uint8_t* input,
                        std::uint8_t* data, std::size_t count, DType dtype,
                        ReduceOp op) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  const std::size_t bytes = count * dtype_size(dtype);
  // Fold the ranks beyond the largest power of two into their odd
  // neighbours, run among a power of two, and unfold at the end.
  int pow2 = 1;
  while (pow2 * 2 <= size) pow2 *= 2;
  const int extra = size - pow2;
  auto real_rank = [&](int virtual_rank) {
    return virtual_rank < extra ? 2 * virtual_rank + 1 : virtual_rank + extra;
  };
  const std::uint8_t* current = input;  // this rank's result so far
  int virtual_rank = -1;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      CollectiveStep& fold = ctx.step();
      fold.send(rank + 1, input, bytes);
      fold.run();
    } else {
      CollectiveStep& fold = ctx.step();
      fold.recv_reduce(rank - 1, data, bytes, dtype, op, input);
      fold.run();
      current = data;
      virtual_rank = rank / 2;
    }
  } else {
    virtual_rank = rank - extra;
  }
  if (virtual_rank >= 0) {
    WorkspaceBuffer partners;  // taken when needed
    for (int mask = 1; mask < pow2; mask <<= 1) {
      const int partner = real_rank(virtual_rank ^ mask);
      CollectiveStep& round = ctx.step();
      round.send(partner, current, bytes);
      if (current != data) {
        // Out of place, `data` is not being sent: reduce into it chunk by
        // chunk while the rest arrives.
        round.recv_reduce(partner, data, bytes, dtype, op, current);
        round.run();
      } else {
        if (partners.get() == nullptr) {
          partners = {ctx.workspace(), bytes};
        }
        round.recv(partner, partners.get(), bytes);
        round.run();
        comm::reduce_pair_into(op, dtype, data, current, partners.get(), count);
      }
      current = data;
    }
  }
  if (rank < 2 * extra) {
    CollectiveStep& unfold = ctx.step();
    if (rank % 2 == 0) {
      unfold.recv(rank + 1, data, bytes);
    } else {
      unfold.send(rank - 1, data, bytes);
    }
    unfold.run();
  }
}

// Which halves of the ring to run. The reduce-scatter half leaves rank r
// with segment r + 1 (mod n) of `data` reduced over every rank; the
// all-gather half starts from there and fills every segment.
enum class Halves { kBoth, kReduceScatter, kAllGather };

void ring(CollectiveTransport& ctx, const std::uint8_t* input,
          std::uint8_t* data, std::size_t count, DType dtype, ReduceOp op,
          Halves halves = Halves::kBoth) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  const std::size_t element = dtype_size(dtype);
  // Segment i: elements segment_of(count, size, i).
  auto segment = [&](int i, bool reduce) {
    const Segment elements = segment_of(count, size, mod(i, size));
    const std::size_t begin = elements.begin * element;
    const std::size_t end = elements.end * element;
    return CollectiveStep::Part{data + begin, end - begin, reduce,
                                reduce ? input + begin : nullptr};
  };
  const bool scatter = halves != Halves::kAllGather;
  const bool gather = halves != Halves::kReduceScatter;
  // What arrives from the left, in order: in reduce-scatter step s the
  // running reduction of segment rank - s - 1, to which this rank adds its
  // own (out of place, from the input where it lies); in all-gather step s
  // the finished segment rank - s.
  std::vector<CollectiveStep::Part> incoming;
  if (scatter) {
    for (int s = 0; s < size - 1; ++s)
      incoming.push_back(segment(rank - s - 1, true));
  }
  if (gather) {
    for (int s = 0; s < size - 1; ++s)
      incoming.push_back(segment(rank - s, false));
  }
  // What goes to the right: this rank's own segment of the input (or, for
  // the all-gather half alone, the finished segment the reduce-scatter
  // left here), then each segment it received, as soon as it is reduced or
  // stored, so that the steps flow into one another and a chunk is
  // forwarded while it is still in cache. Receiving a segment never
  // overwrites bytes not yet sent: what arrives for a byte depends on what
  // this rank sent from it.
  std::vector<CollectiveStep::Part> outgoing;
  CollectiveStep::Part own = segment(scatter ? rank : rank + 1, false);
  if (scatter) own.data = const_cast<std::uint8_t*>(input) + (own.data - data);
  outgoing.push_back(own);
  for (std::size_t s = 0; s + 1 < incoming.size(); ++s) {
    outgoing.push_back({incoming[s].data, incoming[s].bytes});
  }
  CollectiveStep& flow = ctx.step();
  const int source = flow.recv_parts(mod(rank - 1, size), incoming, dtype, op);
  flow.relay(mod(rank + 1, size), outgoing, own.bytes, source);
  flow.run();
}

// See the head comment: three phases over the host views.
void over_hosts(CollectiveTransport& ctx, const HostPartition& hosts,
                const std::uint8_t* input, std::uint8_t* data,
                std::size_t count, DType dtype, ReduceOp op) {
  const std::size_t element = dtype_size(dtype);
  const std::size_t bytes = count * element;
  const auto local_count = static_cast<std::size_t>(
      hosts.ranks_of(hosts.host_of(ctx.rank())).size());
  if (bytes <= ring_threshold_bytes(ctx.size())) {
    detail::copy_bytes(data, input, bytes);
    SubgroupTransport local = host_ranks(ctx, hosts);
    algorithms::reduce(local, data, count, dtype, op, 0);
    if (local.rank() == 0) {
      SubgroupTransport leaders(ctx, host_leaders(hosts, 0));
      algorithms::all_reduce(leaders, data, data, count, dtype, op);
    }
    algorithms::broadcast(local, data, bytes, 0);
    return;
  }
  if (hosts.even() && count >= local_count) {
    SubgroupTransport local = host_ranks(ctx, hosts);
    ring(local, input, data, count, dtype, op, Halves::kReduceScatter);
    const int held = (local.rank() + 1) % local.size();
    const Segment segment = segment_of(count, local.size(), held);
    const std::size_t begin = segment.begin;
    const std::size_t end = segment.end;
    SubgroupTransport across = same_local_index(ctx, hosts);
    algorithms::all_reduce(across, data + begin * element,
                           data + begin * element, end - begin, dtype, op);
    ring(local, data, data, count, dtype, op, Halves::kAllGather);
    return;
  }
  SubgroupTransport ordered = host_ordered(ctx, hosts);
  algorithms::all_reduce(ordered, input, data, count, dtype, op);
}

// The single-copy algorithm of the head comment; `input` may be `data`.
void read_directly(CollectiveTransport& ctx, PeerMemory& memory,
                   const std::uint8_t* input, std::uint8_t* data,
                   std::size_t count, DType dtype, ReduceOp op) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  const std::size_t element = dtype_size(dtype);
  const std::size_t bytes = count * element;
  const Offer offer(memory);
  const std::vector<int> others = peers(ctx);
  // Every peer gets the same message: this rank's input, then its output.
  const std::vector<std::vector<Region>> mine(
      static_cast<std::size_t>(size),
      {region_of(input, bytes), region_of(data, bytes)});
  const auto theirs = trade_regions(ctx, others, mine, others, 2);
  std::vector<Region> inputs(static_cast<std::size_t>(size));
  std::vector<Region> outputs(static_cast<std::size_t>(size));
  const Segment slice = segment_of(count, size, rank);
  const std::size_t begin = slice.begin * element;
  for (int peer : others) {
    check_bytes(ctx, peer, theirs[peer][0], bytes);
    check_bytes(ctx, peer, theirs[peer][1], bytes);
    inputs[peer] = part_from(theirs[peer][0], begin);
    outputs[peer] = theirs[peer][1];
  }
  reduce_from_peers(ctx, memory, inputs, input + begin, data + begin,
                    slice.end - slice.begin, dtype, op);
  memory.confirm(others);
  signal(ctx, others, others);  // every slice is reduced
  read_slices(memory, others, outputs, data, count, size, element);
  memory.confirm(others);
  signal(ctx, others, others);  // nobody reads this rank's buffers any more
}

}  // namespace

std::size_t ring_threshold_bytes(int world_size) {
  if (auto configured = kRingThresholdBytes.get()) {
    return static_cast<std::size_t>(*configured);
  }
  return world_size == 2 ? std::size_t{1} << 20 : std::size_t{64} << 10;
}

void ring_reduce_scatter(CollectiveTransport& ctx, void* data,
                         std::size_t count, DType dtype, ReduceOp op) {
  auto* bytes = static_cast<std::uint8_t*>(data);
  ring(ctx, bytes, bytes, count, dtype, op, Halves::kReduceScatter);
}

void all_reduce(CollectiveTransport& ctx, const void* input, void* output,
                std::size_t count, DType dtype, ReduceOp op) {
  auto* data = static_cast<std::uint8_t*>(output);
  const auto* source = static_cast<const std::uint8_t*>(input);
  const std::size_t bytes = count * dtype_size(dtype);
  const bool small = bytes <= ring_threshold_bytes(ctx.size()) ||
                     count < static_cast<std::size_t>(ctx.size());
  if (ctx.size() == 1) detail::copy_bytes(data, source, bytes);
  if (ctx.size() == 1 || count == 0) return;
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    return over_hosts(ctx, *hosts, source, data, count, dtype, op);
  }
  if (PeerMemory* memory = direct_memory(
          ctx, bytes, DirectKind::kAmongAll, AtTwoRanks::kKeepRings,
          buffers_of({{source, bytes}, {data, bytes}}))) {
    read_directly(ctx, *memory, source, data, count, dtype, op);
  } else if (small) {
    recursive_doubling(ctx, source, data, count, dtype, op);
  } else {
    ring(ctx, source, data, count, dtype, op);
  }
}

}  // namespace comm::tcp::algorithms
