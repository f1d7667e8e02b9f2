#include "backends/tcp/hierarchy.h"

namespace comm::tcp::algorithms {

const HostPartition* spanning_hosts(const CollectiveTransport& ctx) {
  const HostPartition* hosts = ctx.hosts();
  if (hosts == nullptr || hosts->size() != ctx.size() ||
      !hosts->hierarchical()) {
    return nullptr;
  }
  return hosts;
}

SubgroupTransport host_ranks(CollectiveTransport& ctx,
                             const HostPartition& hosts) {
  return SubgroupTransport(ctx, hosts.ranks_of(hosts.host_of(ctx.rank())));
}

SubgroupTransport same_local_index(CollectiveTransport& ctx,
                                   const HostPartition& hosts) {
  const auto index = static_cast<std::size_t>(hosts.local_index(ctx.rank()));
  std::vector<int> members;
  for (int host = 0; host < hosts.host_count(); ++host) {
    const std::vector<int>& ranks = hosts.ranks_of(host);
    if (index < ranks.size()) members.push_back(ranks[index]);
  }
  return SubgroupTransport(ctx, std::move(members));
}

SubgroupTransport host_ordered(CollectiveTransport& ctx,
                               const HostPartition& hosts) {
  return SubgroupTransport(ctx, hosts.host_order());
}

SubgroupTransport root_host_first(CollectiveTransport& ctx,
                                  const HostPartition& hosts, int root) {
  const int root_host = hosts.host_of(root);
  std::vector<int> members{root};
  for (int rank : hosts.ranks_of(root_host)) {
    if (rank != root) members.push_back(rank);
  }
  for (int host = 0; host < hosts.host_count(); ++host) {
    if (host == root_host) continue;
    const std::vector<int>& ranks = hosts.ranks_of(host);
    members.insert(members.end(), ranks.begin(), ranks.end());
  }
  return SubgroupTransport(ctx, std::move(members));
}

std::vector<int> host_leaders(const HostPartition& hosts, int root) {
  std::vector<int> leaders;
  for (int host = 0; host < hosts.host_count(); ++host) {
    leaders.push_back(host == hosts.host_of(root) ? root
                                                  : hosts.ranks_of(host)[0]);
  }
  return leaders;
}

}  // namespace comm::tcp::algorithms
