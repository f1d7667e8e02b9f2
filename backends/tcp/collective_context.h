// comm::tcp::CollectiveContext: the TCP backend's CollectiveTransport for
// one call: the mesh and its control channel, the call (stamped on every
// message), its deadline, and the descriptor that interrupts it at
// shutdown. Its steps are Exchanges, built in place one after another; its
// hosts are the local peers' (shm::LocalPeers::hosts).
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

class CollectiveContext final : public CollectiveTransport, private PeerMemory {
 public:
  // `wake_fd` becomes readable when the backend shuts down (or is -1).
  // The call's buffers come from `workspace`, released when the context
  // is destroyed, as the call ends.
  CollectiveContext(Mesh& mesh, ControlChannel& control, const CallInfo& call,
                    detail::Clock::time_point deadline, int wake_fd,
                    Workspace& workspace)
      : mesh_(mesh),
        control_(control),
        call_(call),
        deadline_(deadline),
        wake_fd_(wake_fd),
        workspace_(workspace) {}
  ~CollectiveContext() override { workspace_.release(); }
  CollectiveContext(const CollectiveContext&) = delete;
  CollectiveContext& operator=(const CollectiveContext&) = delete;

  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  // Ends the previous Exchange and builds the next in its place: a step
  // allocates what an Exchange of its own did, nothing more.
  CollectiveStep& step() override {
    exchange_.emplace(mesh_, call_, deadline_, wake_fd_, &control_,
                      &workspace_);
    return *exchange_;
  }
  const HostPartition* hosts() const override {
    return &mesh_.local_peers().hosts();
  }
  PeerMemory* peer_memory() override {
    return mesh_.local_peers().single_copy() ? this : nullptr;
  }
  std::string describe() const override { return call_.describe(); }
  Workspace* workspace() override { return &workspace_; }

 private:
  void offer() override { mesh_.local_peers().offer(call_.sequence); }
  void withdraw() override { mesh_.local_peers().withdraw(); }
  void read(int peer, const PeerRegion& region, std::uint64_t offset,
            void* into, std::size_t bytes) override;
  const std::uint8_t* mapped(int peer, const PeerRegion& region) override;
  void confirm(std::span<const int> peers) override;
  bool kernel_copy_keeps_up() const override {
    return mesh_.local_peers().kernel_copy_keeps_up();
  }
  std::uint8_t* scratch(std::size_t bytes) override {
    return mesh_.local_peers().scratch(bytes);
  }
  // Throws the error of a failed read or confirm(): `error` is
  // read_memory's (ESRCH, EPERM, ENOSYS, EFAULT) or offered()'s (ESRCH,
  // ECANCELED).
  [[noreturn]] void fail_reading(int peer, int error, std::size_t bytes);
  // Throws the failure a peer reported for this call, if one is recorded
  // or arrives within `grace`.
  void raise_pending_report(std::chrono::milliseconds grace);

  Mesh& mesh_;
  ControlChannel& control_;
  const CallInfo call_;
  const detail::Clock::time_point deadline_;
  const int wake_fd_;
  Workspace& workspace_;
  std::optional<Exchange> exchange_;
};

}  // namespace comm::tcp
