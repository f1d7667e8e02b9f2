// comm::SubgroupTransport: a CollectiveTransport over some of the ranks of
// another, in an order of its own, so that an algorithm written for a
// whole group runs unchanged among the ranks of one host, among one rank
// of each host, or over the whole group ordered host by host: the phases of
// the hierarchical algorithms (tcp/hierarchy.h).
//
// Sub-rank i is the parent's rank members[i]. The view's steps are the
// parent's steps with every peer translated, so they carry what the
// parent's carry: in the TCP backend, the call's MessageHeader, the same in
// every phase of the call. No phase or step number is needed beside it:
// the messages between two ranks arrive in the order they were sent (one
// channel per pair), and every rank derives the same phases from the same
// call and the same HostPartition, so the n-th message a rank receives
// from a peer is the one its n-th receive from that peer expects, whatever
// phase each belongs to. Ranks that disagree about the call (another root,
// another count) still find out from the header of the first message they
// exchange, which names the call, or from the answer to the query a step
// sends while it waits, as in a flat algorithm.
//
// A view knows no hosts (hosts() is null), so what runs over it runs flat:
// the hierarchical algorithms make views of the ranks of one host, or of
// one rank per host, where flat is what they want.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backends/collective_transport.h"
#include "libcomm/error.h"

namespace comm {

class SubgroupTransport final : public CollectiveTransport {
 public:
  // `members`: distinct ranks of `parent`, its own rank among them. The
  // view lives within one call of `parent` and runs while no other step of
  // it does.
  SubgroupTransport(CollectiveTransport& parent, std::vector<int> members)
      : parent_(parent), members_(std::move(members)), step_(members_) {
    const auto own = std::find(members_.begin(), members_.end(), parent.rank());
    if (own == members_.end()) {
      throw InvalidArgument("SubgroupTransport: rank " +
                            std::to_string(parent.rank()) +
                            " is not among the members");
    }
    rank_ = static_cast<int>(own - members_.begin());
    std::vector<int> sorted = members_;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0 || sorted.back() >= parent.size() ||
        std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      throw InvalidArgument(
          "SubgroupTransport: members must be distinct ranks of a group of " +
          std::to_string(parent.size()));
    }
  }
  SubgroupTransport(const SubgroupTransport&) = delete;
  SubgroupTransport& operator=(const SubgroupTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  CollectiveStep& step() override {
    step_.inner = &parent_.step();
    return step_;
  }
  // The parent's call. A view offers no PeerMemory: its ranks' buffers are
  // read only by the flat algorithms' messages (peer_memory() stays null).
  std::string describe() const override { return parent_.describe(); }
  Workspace* workspace() override { return parent_.workspace(); }
  // The parent's rank of sub-rank `i`.
  int member(int i) const { return members_[i]; }

 private:
  // The parent's current step, with peers translated. Receive handles
  // (recv_parts, relay's source) are the parent step's, passed through.
  class Step final : public CollectiveStep {
   public:
    explicit Step(const std::vector<int>& members) : members_(members) {}

    void send(int peer, const void* data, std::size_t bytes) override {
      inner->send(members_[peer], data, bytes);
    }
    void recv(int peer, void* data, std::size_t bytes) override {
      inner->recv(members_[peer], data, bytes);
    }
    void send_address(int peer, const void* data, std::size_t bytes) override {
      inner->send_address(members_[peer], data, bytes);
    }
    void recv_address(int peer, void* data, std::size_t bytes) override {
      inner->recv_address(members_[peer], data, bytes);
    }
    void recv_reduce(int peer, void* data, std::size_t bytes, DType dtype,
                     ReduceOp op, const void* base = nullptr) override {
      inner->recv_reduce(members_[peer], data, bytes, dtype, op, base);
    }
    int recv_parts(int peer, std::span<const Part> parts, DType dtype,
                   ReduceOp op) override {
      return inner->recv_parts(members_[peer], parts, dtype, op);
    }
    void relay(int peer, std::span<const Part> parts, std::size_t ready,
               int source) override {
      inner->relay(members_[peer], parts, ready, source);
    }
    void send_confirmation(int peer) override {
      inner->send_confirmation(members_[peer]);
    }
    void expect_confirmation(int peer) override {
      inner->expect_confirmation(members_[peer]);
    }
    void send_owed_confirmations() override {
      inner->send_owed_confirmations();
    }
    void run() override { inner->run(); }

    CollectiveStep* inner = nullptr;

   private:
    const std::vector<int>& members_;
  };

  CollectiveTransport& parent_;
  const std::vector<int> members_;
  Step step_;
  int rank_ = 0;
};

}  // namespace comm
