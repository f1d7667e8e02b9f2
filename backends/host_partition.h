// comm::HostPartition: which ranks of a group share a host, as every rank
// of the group sees it.
//
// Hierarchical algorithms pick their phases from it, and every rank must
// pick the same ones, so a partition may only be built from what every
// rank knows alike (the TCP backend builds it from the host identities
// each rank publishes in the store, shm::LocalPeers). Hosts are numbered
// in the order of their lowest ranks and list their ranks in rank order, so
// two ranks given the same labels build equal partitions.
#pragma once

#include <string>
#include <vector>

namespace comm {

class HostPartition {
 public:
  // Every rank of `size` a host of its own.
  explicit HostPartition(int size);
  // Rank r on the host labelled labels[r]: ranks with equal labels share a
  // host. The labels themselves are arbitrary.
  explicit HostPartition(const std::vector<int>& labels);

  int size() const { return static_cast<int>(host_of_.size()); }
  int host_count() const { return static_cast<int>(hosts_.size()); }
  int host_of(int rank) const { return host_of_[rank]; }
  // `rank`'s position among the ranks of its host, in rank order.
  int local_index(int rank) const { return local_index_[rank]; }
  // The ranks of `host`, in rank order.
  const std::vector<int>& ranks_of(int host) const { return hosts_[host]; }
  // The ranks host by host: ranks_of(0), ranks_of(1), and so on.
  const std::vector<int>& host_order() const { return host_order_; }
  // Whether every host has as many ranks as every other.
  bool even() const { return even_; }
  // Whether the group spans several hosts and some host has several ranks:
  // the groups where a hierarchical algorithm differs from a flat one.
  bool hierarchical() const {
    return host_count() > 1 && host_count() < size();
  }
  // "{0,1} {2,3}", for logs and messages.
  std::string describe() const;

  bool operator==(const HostPartition&) const = default;

 private:
  std::vector<int> host_of_;
  std::vector<int> local_index_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> host_order_;
  bool even_ = true;
};

}  // namespace comm
