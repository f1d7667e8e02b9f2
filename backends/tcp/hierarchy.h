// The pieces of the hierarchical algorithms: for a group spanning hosts,
// most collectives compose flat algorithms run over views of the group
// (SubgroupTransport): the ranks of one host, one rank per host, every
// rank ordered host by host, or every rank ordered from the root's host
// on (scatter's small tree); the broadcast builds one tree of its own
// from the leaders' and the hosts' trees. Inside a host the messages go
// through shared memory, between hosts over TCP, since the transport picks
// each pair's link. Each collective's file says what it composes, and why.
//
// Every rank of a call must run the same phases, so the choice depends
// only on the call and on the HostPartition, which every rank builds from
// the same published identities (shm::LocalPeers).
#pragma once

#include <vector>

#include "backends/collective_transport.h"
#include "backends/host_partition.h"
#include "backends/subgroup_transport.h"

namespace comm::tcp::algorithms {

// The hosts of `ctx` where a hierarchical algorithm differs from a flat
// one (several hosts, and one with several ranks), else null.
const HostPartition* spanning_hosts(const CollectiveTransport& ctx);

// The ranks of this rank's host, in rank order.
SubgroupTransport host_ranks(CollectiveTransport& ctx,
                             const HostPartition& hosts);
// The ranks whose local index is this rank's, one per host that has such a
// rank, in host order.
SubgroupTransport same_local_index(CollectiveTransport& ctx,
                                   const HostPartition& hosts);
// Every rank, host by host (HostPartition::host_order): a ring over it
// crosses from one host to the next once.
SubgroupTransport host_ordered(CollectiveTransport& ctx,
                               const HostPartition& hosts);
// Every rank, `root` first, then the other ranks of its host, then the
// other hosts' ranks host by host (each host's in rank order): the order
// of scatter's small tree across hosts (scatter.cpp says why).
SubgroupTransport root_host_first(CollectiveTransport& ctx,
                                  const HostPartition& hosts, int root);
// Each host's leader, in host order: `root` on its own host, elsewhere
// the host's lowest rank. Leader host_of(root) is the root, so a tree
// over the leaders rooted there is rooted at `root`.
std::vector<int> host_leaders(const HostPartition& hosts, int root);

}  // namespace comm::tcp::algorithms
