// reduce: a binomial tree towards `root`, each rank reducing its children's
// data into its own buffer (in chunks, with O(chunk) scratch) before
// sending the result to its parent. A parent sends each child an empty
// message (a header alone) in the step that receives from it: a
// confirmation that the parent is in the same call, so that ranks that
// name different roots read a header naming another root and fail with
// MismatchError instead of only sending unnoticed (see gather.cpp). The
// child reads it after the call (recv_confirmation), as its next
// collective begins, so it does not wait for its parent to arrive.
//
// Over a group spanning hosts (hierarchy.h), two phases: the same tree
// inside each host, towards its leader (the root on the root's host, the
// lowest rank on the others), over shared memory, then among the leaders
// towards the root, so that each host sends its share over the network
// once, where a flat tree crosses the network as often as its edges join
// ranks of two hosts. The order in which the contributions are combined
// changes with the tree; only the root holds the result.
#include "backends/tcp/algorithms.h"
#include "backends/tcp/hierarchy.h"

namespace comm::tcp::algorithms {
namespace {

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

}  // namespace

void reduce(CollectiveTransport& ctx, void* data, std::size_t count,
            DType dtype, ReduceOp op, int root) {
  const int size = ctx.size();
  if (size == 1) return;
  if (const HostPartition* hosts = spanning_hosts(ctx)) {
    return over_hosts(ctx, *hosts, data, count, dtype, op, root);
  }
  const std::size_t bytes = count * dtype_size(dtype);
  const int relative = (ctx.rank() - root + size) % size;
  auto real = [&](int r) { return (r + root) % size; };
  for (int mask = 1; mask < size; mask <<= 1) {
    if (relative & mask) {
      CollectiveStep& to_parent = ctx.step();
      const int parent = real(relative & ~mask);
      to_parent.send(parent, data, bytes);
      to_parent.recv_confirmation(parent);
      to_parent.run();
      return;
    }
    if (relative + mask < size) {
      CollectiveStep& from_child = ctx.step();
      const int child = real(relative + mask);
      from_child.recv_reduce(child, data, bytes, dtype, op);
      from_child.send(child, nullptr, 0);
      from_child.run();
    }
  }
}

}  // namespace comm::tcp::algorithms
