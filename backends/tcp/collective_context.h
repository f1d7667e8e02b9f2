// comm::tcp::CollectiveContext: the TCP backend's CollectiveTransport for
// one call: the mesh and its control channel, the call (stamped on every
// message), its deadline, and the descriptor that interrupts it at
// shutdown. Its steps are Exchanges, built in place one after another; its
// hosts are the local peers' (shm::LocalPeers::hosts).
//
// Confirmations (CollectiveStep::recv_confirmation) may be read after the
// call: the backend keeps what a call's steps leave in its
// DeferredConfirmations and reads it (settle_confirmations) as its next
// collective begins. No step defers them yet (see step()).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "backends/collective_transport.h"
#include "backends/peer_memory.h"
#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/message_header.h"

namespace comm::tcp {

// The confirmations one call's steps left to be read after it: the call
// they confirm, and the peers that owe one (a peer once per confirmation).
struct DeferredConfirmations {
  CallInfo call;
  std::vector<int> peers;
};

// Reads and checks every confirmation in `deferred`, within `deadline`, and
// empties it. Throws as Exchange::run does; a confirmation that names
// another call is a MismatchError naming both.
inline void settle_confirmations(Mesh& mesh, ControlChannel& control,
                                 DeferredConfirmations& deferred,
                                 detail::Clock::time_point deadline,
                                 int wake_fd) {
  read_confirmations(mesh, &control, deferred.call, deferred.peers, deadline,
                     wake_fd);
}

class CollectiveContext final : public CollectiveTransport, private PeerMemory {
 public:
  // `wake_fd` becomes readable when the backend shuts down (or is -1).
  // `deferred` must be settled (empty); the call's steps fill it.
  CollectiveContext(Mesh& mesh, ControlChannel& control, const CallInfo& call,
                    detail::Clock::time_point deadline, int wake_fd,
                    DeferredConfirmations& deferred)
      : mesh_(mesh),
        control_(control),
        call_(call),
        deadline_(deadline),
        wake_fd_(wake_fd),
        deferred_(deferred) {
    deferred_.call = call;
  }

  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  // Ends the previous Exchange and builds the next in its place: a step
  // allocates what an Exchange of its own did, nothing more.
  CollectiveStep& step() override {
    exchange_.emplace(mesh_, call_, deadline_, wake_fd_, &control_);
    // Confirmations are received in the step. A rank that read them after
    // the call could return, and close its channels, before a peer had sent
    // its confirmation, which would fail that peer's send; deferring them
    // (set_deferred_confirmations) needs confirmation sends that succeed
    // when their receiver has already left.
    return *exchange_;
  }
  const HostPartition* hosts() const override {
    return &mesh_.local_peers().hosts();
  }
  PeerMemory* peer_memory() override {
    return mesh_.local_peers().single_copy() ? this : nullptr;
  }
  std::string describe() const override { return call_.describe(); }

 private:
  void offer() override { mesh_.local_peers().offer(call_.sequence); }
  void withdraw() override { mesh_.local_peers().withdraw(); }
  void read(int peer, std::uint64_t address, void* into,
            std::size_t bytes) override;
  void confirm(int peer) override;
  std::uint8_t* scratch(std::size_t bytes) override {
    return mesh_.local_peers().scratch(bytes);
  }
  // Throws the error of a failed read or confirm(): `error` is
  // read_memory's or offered()'s.
  [[noreturn]] void fail_reading(int peer, int error, std::size_t bytes);
  // Throws the failure a peer reported for this call, if one is recorded
  // or arrives within `grace`.
  void raise_pending_report(std::chrono::milliseconds grace);

  Mesh& mesh_;
  ControlChannel& control_;
  const CallInfo call_;
  const detail::Clock::time_point deadline_;
  const int wake_fd_;
  DeferredConfirmations& deferred_;
  std::optional<Exchange> exchange_;
};

}  // namespace comm::tcp
