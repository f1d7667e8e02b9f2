// comm::tcp::CollectiveContext: the TCP backend's CollectiveTransport for
// one call: the mesh and its control channel, the call (stamped on every
// message), its deadline, and the descriptor that interrupts it at
// shutdown. Its steps are
// Exchanges, built in place one after another; its hosts are the local
// peers' (shm::LocalPeers::hosts).
#pragma once

#include <optional>

#include "backends/collective_transport.h"
#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/message_header.h"

namespace comm::tcp {

class CollectiveContext final : public CollectiveTransport {
 public:
  // `wake_fd` becomes readable when the backend shuts down (or is -1).
  CollectiveContext(Mesh& mesh, ControlChannel& control, const CallInfo& call,
                    detail::Clock::time_point deadline, int wake_fd)
      : mesh_(mesh),
        control_(control),
        call_(call),
        deadline_(deadline),
        wake_fd_(wake_fd) {}

  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  // Ends the previous Exchange and builds the next in its place: a step
  // allocates what an Exchange of its own did, nothing more.
  CollectiveStep& step() override {
    exchange_.emplace(mesh_, call_, deadline_, wake_fd_, &control_);
    return *exchange_;
  }
  const HostPartition* hosts() const override {
    return &mesh_.local_peers().hosts();
  }

 private:
  Mesh& mesh_;
  ControlChannel& control_;
  const CallInfo call_;
  const detail::Clock::time_point deadline_;
  const int wake_fd_;
  std::optional<Exchange> exchange_;
};

}  // namespace comm::tcp
