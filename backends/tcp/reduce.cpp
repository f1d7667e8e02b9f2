// reduce: a binomial tree towards `root`, each rank reducing its children's
// data into its own buffer (in chunks, with O(chunk) scratch) before
// sending the result to its parent. A parent confirms to each child, once
// it has received from it, that it is in the same call, which the child
// reads up to a window of calls later, so that
// ranks that name different roots read a header naming another root and
// fail with MismatchError instead of only sending and returning success
// (see broadcast.cpp), while a child that is ready before its parent does
// not wait for it.
//
// From 1 MiB at four ranks or more, two steps instead of the tree: the
// ring all_reduce's reduce-scatter half, which leaves each rank r with
// segment r + 1 of the message reduced over every rank, then every rank
// sends its segment to the root, which receives them all at once. Each
// rank reduces 1/n of the message where the tree makes the root reduce
// log2(n) whole messages, one level after another; a rank other than the
// root sends one message's worth in all ((n-1)/n in the ring, 1/n to the
// root), as a child of the tree does. Below 1 MiB the ring's n - 1 steps
// cost more than they save; at two ranks the tree is one pipelined
// transfer already, and at three the two were even (bench/README.md,
// "Reduce: the tree, or reduce-scatter and gather"). Ranks that name
// different roots disagree in the ring, where every rank receives from its
// left neighbour a header that names the root it chose, so no
// confirmation is needed; a rank whose left neighbour agrees with it may
// send its segment to the root it named and return, and fails its next
// call as in the tree.
//
// Over a group spanning hosts (hierarchy.h), two phases: the same tree
// inside each host, towards its leader (the root on the root's host, the
// lowest rank on the others), over shared memory, then among the leaders
// towards the root, so that each host sends its share over the network
// once, where a flat tree crosses the network as often as its edges join
// ranks of two hosts. The order in which the contributions are combined
// changes with the tree; only the root holds the result.
//
// Where every rank is on this host and may read the others' memory, and
// the message holds COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES or more, the ranks
// reduce where the data lies (single_copy.h): they trade their buffers'
// addresses; each rank reduces its slice (the ring all_reduce's segment of
// its rank) from every rank's buffer, in rank order, into the same slice
// of its own buffer, and tells the root; the root, once every rank has,
// reads each slice from the buffer of the rank that reduced it and tells
// every rank it is done. Until the root's "done" no rank returns: the root
// reads its result, and a rank q reads slice q of the others' buffers
// before it tells the root. A rank writes only its own slice before the
// root hears from every rank, and only the root writes after, so nothing
// is written while another rank reads it. The buffers of the ranks other
// than the root hold their reduced slice afterwards (Backend::reduce
// leaves them unspecified).
//
// Where every rank's buffer lies in shared host memory, at three ranks or
// fewer (single_copy.h, in_flat_tree), the root maps the others' buffers
// (PeerMemory::mapped) and, below
// kRootReducesAloneBelowBytes, reduces them all itself, in rank order,
// where they lie: one message from each rank to the root (its buffer's
// region) and one back (done), and no copy. The slices' algorithm above
// takes two more steps, which a plain copy does not pay back below that
// size (bench/README.md, "Shared host memory").
#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {
namespace {

constexpr std::size_t kRootReducesAloneBelowBytes = 4 << 20;

// The root reduces every rank's buffer where it lies (the head comment).
void root_reduces_alone(CollectiveTransport& ctx, PeerMemory& memory,
                        std::uint8_t* data, std::size_t count, DType dtype,
                        ReduceOp op, int root) {
  const int size = ctx.size();
  const std::size_t bytes = count * dtype_size(dtype);
  const Offer offer(memory);
  if (ctx.rank() != root) {
    lend_to(ctx, root, region_of(data, bytes));
    return;
  }
  const std::vector<int> others = peers(ctx);
  const auto theirs = trade_regions(ctx, {}, {}, others, 1);
  std::vector<Region> operands(static_cast<std::size_t>(size));
  for (int peer : others) {
    check_bytes(ctx, peer, theirs[peer][0], bytes);
    operands[peer] = theirs[peer][0];
  }
  reduce_from_peers(ctx, memory, operands, data, data, count, dtype, op);
  memory.confirm(others);
  signal(ctx, others, {});
}

void over_hosts(CollectiveTransport& ctx, const HostPartition& hosts,
                void* data, std::size_t count, DType dtype, ReduceOp op,
                int root) {
  const std::vector<int> leaders = host_leaders(hosts, root);
  const int leader = leaders[hosts.host_of(ctx.rank())];
  SubgroupTransport local = host_ranks(ctx, hosts);
  algorithms::reduce(local, data, count, dtype, op, hosts.local_index(leader));
  if (ctx.rank() == leader) {
    SubgroupTransport across(ctx, leaders);
    algorithms::reduce(across, data, count, dtype, op, hosts.host_of(root));
  }
}

// The smallest reduce that takes the reduce-scatter and the gather.
constexpr std::size_t kScatterGatherBytes = std::size_t{1} << 20;

// The head comment's large-message reduce.
void scatter_then_gather(CollectiveTransport& ctx, void* data,
                         std::size_t count, DType dtype, ReduceOp op,
                         int root) {
  const int size = ctx.size();
  const std::size_t element = dtype_size(dtype);
  auto* buffer = static_cast<std::uint8_t*>(data);
  auto held_by = [&](int rank) {
    const Segment segment = segment_of(count, size, (rank + 1) % size);
    return CollectiveStep::Part{buffer + segment.begin * element,
                                (segment.end - segment.begin) * element};
  };
  ring_reduce_scatter(ctx, data, count, dtype, op);
  CollectiveStep& to_root = ctx.step();
  if (ctx.rank() != root) {
    const CollectiveStep::Part mine = held_by(ctx.rank());
    to_root.send(root, mine.data, mine.bytes);
  } else {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == root) continue;
      const CollectiveStep::Part theirs = held_by(peer);
      to_root.recv(peer, theirs.data, theirs.bytes);
    }
  }
  to_root.run();
}

}  // namespace

void reduce(CollectiveTransport& ctx, void* data, std::size_t count,
            DType dtype, ReduceOp op, int root) {
  const int size = ctx.size();
  if (size == 1) return;
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    return over_hosts(ctx, *hosts, data, count, dtype, op, root);
  }
  const std::size_t element = dtype_size(dtype);
  const std::size_t bytes = count * element;
  const Buffers judged = in_flat_tree(ctx, buffers_of({{data, bytes}}));
  if (PeerMemory* memory = direct_memory(ctx, bytes, DirectKind::kToRoot,
                                         AtTwoRanks::kReadDirectly, judged)) {
    if (judged == Buffers::kShared && bytes < kRootReducesAloneBelowBytes) {
      return root_reduces_alone(ctx, *memory, static_cast<std::uint8_t*>(data),
                                count, dtype, op, root);
    }
    const Offer offer(*memory);
    auto* buffer = static_cast<std::uint8_t*>(data);
    const std::vector<int> others = peers(ctx);
    const std::vector<std::vector<Region>> mine(static_cast<std::size_t>(size),
                                                {region_of(data, bytes)});
    const auto theirs = trade_regions(ctx, others, mine, others, 1);
    for (int peer : others) check_bytes(ctx, peer, theirs[peer][0], bytes);
    const Segment slice = segment_of(count, size, ctx.rank());
    const std::size_t begin = slice.begin * element;
    std::vector<Region> buffers(static_cast<std::size_t>(size));
    std::vector<Region> operands(static_cast<std::size_t>(size));
    for (int peer : others) {
      buffers[peer] = theirs[peer][0];
      operands[peer] = part_from(buffers[peer], begin);
    }
    reduce_from_peers(ctx, *memory, operands, buffer + begin, buffer + begin,
                      slice.end - slice.begin, dtype, op);
    memory->confirm(others);
    if (ctx.rank() != root) {
      signal(ctx, {root}, {root});  // reduced; then wait for the root
      return;
    }
    signal(ctx, {}, others);
    read_slices(*memory, others, buffers, buffer, count, size, element);
    memory->confirm(others);
    signal(ctx, others, {});
    return;
  }
  if (size >= 4 && bytes >= kScatterGatherBytes &&
      count >= static_cast<std::size_t>(size)) {
    return scatter_then_gather(ctx, data, count, dtype, op, root);
  }
  // broadcast's tree (BinomialTree), the data flowing up: a rank takes its
  // children in the order their subtrees finish, the smallest (the largest
  // power) first, then sends to its parent.
  const BinomialTree place(ctx.rank(), size, root);
  int last_power = 0;
  for (int power = place.first_power; place.relative + power < size;
       power <<= 1) {
    last_power = power;
  }
  for (int power = last_power; power >= place.first_power; power >>= 1) {
    CollectiveStep& from_child = ctx.step();
    const int child = place.real(place.relative + power);
    from_child.recv_reduce(child, data, bytes, dtype, op);
    from_child.send_confirmation(child);
    from_child.run();
  }
  if (place.parent >= 0) {
    CollectiveStep& to_parent = ctx.step();
    const int parent = place.real(place.parent);
    to_parent.send(parent, data, bytes);
    to_parent.expect_confirmation(parent);
    to_parent.run();
  }
}

}  // namespace comm::tcp::algorithms
