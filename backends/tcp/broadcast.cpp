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
// Over a group spanning hosts (hierarchy.h), two phases: the same tree
// among one leader per host (the root on its host, the lowest rank on the
// others), so that each host receives the message over the network once,
// then the tree inside each host from its leader, over shared memory. A
// flat tree crosses the network as often as its edges join ranks of two
// hosts, up to once per rank where the hosts' ranks interleave. The cost:
// a leader forwards inside its host only once the whole message has
// arrived, where one tree would pipeline the two; the shared-memory phase
// is the short one. Each phase keeps its children's confirmations, so ranks
// that name different roots still read a header that says so.
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
#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"
#include "backends/tcp/single_copy.h"

namespace comm::tcp::algorithms {
namespace {

void over_hosts(CollectiveTransport& ctx, const HostPartition& hosts,
                void* data, std::size_t bytes, int root) {
  const std::vector<int> leaders = host_leaders(hosts, root);
  const int leader = leaders[hosts.host_of(ctx.rank())];
  if (ctx.rank() == leader) {
    SubgroupTransport across(ctx, leaders);
    algorithms::broadcast(across, data, bytes, hosts.host_of(root));
  }
  SubgroupTransport local = host_ranks(ctx, hosts);
  algorithms::broadcast(local, data, bytes, hosts.local_index(leader));
}

}  // namespace

void broadcast(CollectiveTransport& ctx, void* data, std::size_t bytes,
               int root) {
  const int size = ctx.size();
  if (size == 1) return;
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    return over_hosts(ctx, *hosts, data, bytes, root);
  }
  if (PeerMemory* memory = direct_memory(ctx, bytes, DirectKind::kFromRoot,
                                         AtTwoRanks::kKeepRings)) {
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
      memory->read(root, theirs[root][0].address, data, bytes);
      memory->confirm({&root, 1});
      signal(ctx, {root}, {});
    }
    return;
  }
  const BinomialTree place(ctx.rank(), size, root);
  const CollectiveStep::Part whole{static_cast<std::uint8_t*>(data), bytes};
  CollectiveStep& tree = ctx.step();
  // The root has everything at once; any other rank relays what its parent
  // sends, to its children largest subtree first.
  int source = -1;
  if (place.parent >= 0) {
    const int parent = place.real(place.parent);
    source = tree.recv_parts(parent, {&whole, 1}, DType::kU8, ReduceOp::kSum);
    tree.send_confirmation(parent);
  }
  for (int power = place.first_power; place.relative + power < size;
       power <<= 1) {
    const int child = place.real(place.relative + power);
    if (source < 0) {
      tree.send(child, data, bytes);
    } else {
      tree.relay(child, {&whole, 1}, 0, source);
    }
    tree.expect_confirmation(child);
  }
  tree.run();
}

}  // namespace comm::tcp::algorithms
