// broadcast: a binomial tree rooted at `root`, pipelined: each rank
// receives from its parent and passes the bytes on to its children as they
// arrive, so a large message crosses the log2(n) levels at once instead of
// one level after another.
//
// Each child also confirms to its parent that it is in the same call
// (CollectiveStep::send_confirmation), once it has received the message.
// Without it two ranks that both name themselves the root would only send, and
// both return success with different data; with it each reads the other's
// message, whose header names another root, and fails with MismatchError. A
// parent reads its children's confirmations up to a window of calls later
// (CollectiveStep::expect_confirmation), so it does not wait for its children
// to arrive, and fails one of its next calls when they disagree.
//
// Over a group spanning hosts (hierarchy.h), one tree made of two: the
// same binomial tree among one leader per host (the root on its host, the
// lowest rank on the others), so that each host receives the message over
// the network once, and under each leader the binomial tree of its host's
// ranks, over shared memory. A flat tree crosses the network as often as
// its edges join ranks of two hosts, up to once per rank where the hosts'
// ranks interleave. Being one tree, it pipelines as the flat one does: a
// leader passes the bytes on to its host as they arrive from the network,
// where running the two trees one after the other added the time of the
// shared-memory phase to that of the network phase. A leader sends to the
// other hosts first: each of those sends feeds a whole host, over the
// slower link.
//
// Where the group has three ranks or more, every one on this host and free
// to read the others' memory, and the message holds
// COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES or more, every rank reads it from
// the root's buffer (single_copy.h): the root sends each rank its buffer's
// address and size, each rank reads it and tells the root it is done, and the
// root returns once every rank is. Ranks that name different roots read, in
// one of the two steps, a header naming another root, or ask the rank they
// wait for which call it is in, and fail with MismatchError. Two ranks keep
// the tree: its one edge is a copy on each core at once (the root copies in
// from lines its own cache holds, the other rank copies out), which one
// rank's read of the root's lines did not beat at any size measured; from
// three ranks the root copies in once per child and the readers' parallel
// reads win (bench/README.md, "Single copy").
#include <array>
#include <span>
#include <vector>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {
namespace {

// This rank's edges in a broadcast tree, as group ranks: its parent (-1 at
// the root) and its children, in the order it sends to them. A binomial
// tree gives a rank fewer than 32 children, and a rank has children in two
// trees at most.
struct TreeEdges {
  int parent = -1;
  std::array<int, 64> children{};
  int child_count = 0;

  std::span<const int> child_ranks() const {
    return {children.data(), static_cast<std::size_t>(child_count)};
  }
};

// Adds this rank's edges in the binomial tree over `size` members rooted
// at member `root`, where this rank is member `index` and member(i) is
// member i's group rank.
template <typename Member>
void add_binomial_edges(TreeEdges& edges, int size, int index, int root,
                        Member member) {
  const BinomialTree place(index, size, root);
  if (place.parent >= 0) edges.parent = member(place.real(place.parent));
  for (int power = place.first_power; place.relative + power < size;
       power <<= 1) {
    edges.children[edges.child_count++] =
        member(place.real(place.relative + power));
  }
}

TreeEdges flat_edges(const CollectiveTransport& ctx, int root) {
  TreeEdges edges;
  add_binomial_edges(edges, ctx.size(), ctx.rank(), root,
                     [](int r) { return r; });
  return edges;
}

TreeEdges over_hosts_edges(const CollectiveTransport& ctx,
                           const HostPartition& hosts, int root) {
  const std::vector<int> leaders = host_leaders(hosts, root);
  const int host = hosts.host_of(ctx.rank());
  const int leader = leaders[host];
  TreeEdges edges;
  if (ctx.rank() == leader) {
    add_binomial_edges(edges, hosts.host_count(), host, hosts.host_of(root),
                       [&](int h) { return leaders[h]; });
  }
  const std::vector<int>& local = hosts.ranks_of(host);
  add_binomial_edges(edges, static_cast<int>(local.size()),
                     hosts.local_index(ctx.rank()), hosts.local_index(leader),
                     [&](int i) { return local[i]; });
  return edges;
}

// Runs the tree: the root has everything at once; any other rank relays
// what its parent sends, to its children in order, as it arrives.
void run_tree(CollectiveTransport& ctx, void* data, std::size_t bytes,
              const TreeEdges& edges) {
  const CollectiveStep::Part whole{static_cast<std::uint8_t*>(data), bytes};
  CollectiveStep& tree = ctx.step();
  int source = -1;
  if (edges.parent >= 0) {
    source =
        tree.recv_parts(edges.parent, {&whole, 1}, DType::kU8, ReduceOp::kSum);
    tree.send_confirmation(edges.parent);
  }
  for (const int child : edges.child_ranks()) {
    if (source < 0) {
      tree.send(child, data, bytes);
    } else {
      tree.relay(child, {&whole, 1}, 0, source);
    }
    tree.expect_confirmation(child);
  }
  tree.run();
}

}  // namespace

void broadcast(CollectiveTransport& ctx, void* data, std::size_t bytes,
               int root) {
  const int size = ctx.size();
  if (size == 1) return;
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    return run_tree(ctx, data, bytes, over_hosts_edges(ctx, *hosts, root));
  }
  if (PeerMemory* memory = direct_memory(
          ctx, bytes, DirectKind::kFromRoot, AtTwoRanks::kKeepRings,
          in_flat_tree(ctx, buffers_of({{data, bytes}})))) {
    const Offer offer(*memory);
    const std::vector<int> others = peers(ctx);
    if (ctx.rank() == root) {
      const std::vector<std::vector<Region>> mine(
          static_cast<std::size_t>(size), {region_of(data, bytes)});
      trade_regions(ctx, others, mine, {}, 0);
      signal(ctx, {}, others);
    } else {
      const auto theirs = trade_regions(ctx, {}, {}, {root}, 1);
      check_bytes(ctx, root, theirs[root][0], bytes);
      memory->read(root, theirs[root][0], 0, data, bytes);
      memory->confirm({&root, 1});
      signal(ctx, {root}, {});
    }
    return;
  }
  run_tree(ctx, data, bytes, flat_edges(ctx, root));
}

}  // namespace comm::tcp::algorithms
