#include "backends/host_partition.h"

#include <numeric>

#include "libcomm/error.h"

namespace comm {
namespace {

std::vector<int> distinct_labels(int size) {
  if (size < 0) {
    throw InvalidArgument("HostPartition: a group of " + std::to_string(size) +
                          " ranks");
  }
  std::vector<int> labels(static_cast<std::size_t>(size));
  std::iota(labels.begin(), labels.end(), 0);
  return labels;
}

}  // namespace

HostPartition::HostPartition(int size) : HostPartition(distinct_labels(size)) {}

HostPartition::HostPartition(const std::vector<int>& labels)
    : host_of_(labels.size()), local_index_(labels.size()) {
  // Quadratic in the number of hosts, once per group.
  std::vector<int> host_labels;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    std::size_t host = 0;
    while (host < host_labels.size() && host_labels[host] != labels[r]) ++host;
    if (host == host_labels.size()) {
      host_labels.push_back(labels[r]);
      hosts_.emplace_back();
    }
    host_of_[r] = static_cast<int>(host);
    local_index_[r] = static_cast<int>(hosts_[host].size());
    hosts_[host].push_back(static_cast<int>(r));
  }
  for (const auto& ranks : hosts_) {
    host_order_.insert(host_order_.end(), ranks.begin(), ranks.end());
    even_ = even_ && ranks.size() == hosts_.front().size();
  }
}

std::string HostPartition::describe() const {
  std::string text;
  for (const auto& ranks : hosts_) {
    text += text.empty() ? "{" : " {";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      text += (i == 0 ? "" : ",") + std::to_string(ranks[i]);
    }
    text += "}";
  }
  return text;
}

}  // namespace comm
