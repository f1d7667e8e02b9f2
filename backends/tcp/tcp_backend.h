// comm::TcpBackend: the CPU backend. A full mesh of TCP connections set up
// through the group's Store, collectives run one at a time in the order
// they were issued (by a worker thread, or by the caller that waits for
// them: tcp/collective_scheduler.h), and point-to-point traffic moved by a
// thread of its own. CUDA tensors are staged through host memory.
//
// A collective that fails (a peer died, ranks called different
// collectives, a timeout) tells the other ranks on the control channel, so
// that they fail too instead of waiting for their timeouts, and leaves the
// group unusable for collectives: later ones fail at once with an error
// that names the first failure, as after an NCCL communicator abort. A
// control thread sends heartbeats, so that a peer that is frozen or cut off
// is named within COMM_HEARTBEAT_TIMEOUT (tcp/control_channel.h).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "backends/backend.h"
#include "store/store.h"

namespace comm {

class Workspace;
namespace tcp {
class Mesh;
class ControlChannel;
class PointToPoint;
class CollectiveScheduler;
class CollectiveTask;
struct CollectiveContext;
struct CallInfo;
}  // namespace tcp

class COMM_API TcpBackend final : public Backend {
 public:
  // Connects to every other rank through `store` (keys under "tcp/"); every
  // rank of the group constructs its TcpBackend at about the same time.
  // `timeout` bounds the set-up and is the default of every operation.
  TcpBackend(std::shared_ptr<Store> store, int rank, int size,
             std::chrono::milliseconds timeout);
  ~TcpBackend() override;

  std::string name() const override { return "tcp"; }

  void shutdown() override;

 private:
  std::shared_ptr<Work> do_broadcast(Tensor& tensor,
                                     const BroadcastOptions& options) override;
  std::shared_ptr<Work> do_reduce(Tensor& tensor,
                                  const ReduceOptions& options) override;
  std::shared_ptr<Work> do_all_reduce(Tensor& tensor,
                                      const AllReduceOptions& options) override;
  std::shared_ptr<Work> do_all_reduce_into(
      Tensor& output, const Tensor& input,
      const AllReduceOptions& options) override;
  std::shared_ptr<Work> do_all_gather(std::vector<Tensor>& outputs,
                                      const Tensor& input,
                                      const AllGatherOptions& options) override;
  std::shared_ptr<Work> do_all_gather_into(
      Tensor& output, const Tensor& input,
      const AllGatherOptions& options) override;
  std::shared_ptr<Work> do_gather(std::vector<Tensor>& outputs,
                                  const Tensor& input,
                                  const GatherOptions& options) override;
  std::shared_ptr<Work> do_scatter(Tensor& output,
                                   const std::vector<Tensor>& inputs,
                                   const ScatterOptions& options) override;
  std::shared_ptr<Work> do_reduce_scatter(
      Tensor& output, const std::vector<Tensor>& inputs,
      const ReduceScatterOptions& options) override;
  std::shared_ptr<Work> do_all_to_all(Tensor& output, const Tensor& input,
                                      const AllToAllOptions& options) override;
  std::shared_ptr<Work> do_barrier(const BarrierOptions& options) override;
  std::shared_ptr<Work> do_send(const Tensor& tensor, int dst,
                                const SendOptions& options) override;
  std::shared_ptr<Work> do_recv(Tensor& tensor, int src,
                                const RecvOptions& options) override;

  // Queues a collective: stamps it with the next sequence number; `body`,
  // a callable taking tcp::CollectiveContext& and then a reference to each
  // of `held` (the call's tensors), runs with the deadline of the options'
  // timeout, on the worker thread or on the thread that waits for it,
  // whichever comes first, always in issue order; with the options'
  // async_op false, on this thread before enqueue returns when nothing is
  // queued or running (CollectiveScheduler::enqueue). A queued call keeps
  // copies of `held` and of `body`'s captures until it has run; one run at
  // once uses the caller's, and copies nothing.
  template <typename Options, typename Body, typename... Held>
  std::shared_ptr<Work> enqueue(const tcp::CallInfo& call,
                                const Options& options, Body&& body,
                                Held&&... held);
  // Runs one collective's body within its timeout, on whichever thread
  // holds the scheduler's turn; a failure is reported to the other ranks
  // (unless they reported it) and thrown.
  void execute(tcp::CollectiveTask& task);
  // The Work of a send or receive, numbered in this rank's point-to-point
  // order ("send #3 (float32 x 16, tag 0) to rank 1"). Throws when shut down.
  std::shared_ptr<Work> point_to_point_work(const char* kind,
                                            const Tensor& tensor, int tag,
                                            const std::string& peer);
  void check_open() const;
  std::chrono::milliseconds resolve(OpTimeout timeout) const;

  // How long shutdown() waits at most for the peers' confirmations of the
  // last rooted calls (tcp::Exchange::finish_confirmations), where the
  // timeout is longer.
  static constexpr std::chrono::milliseconds kConfirmationLinger{1000};
  // How long shutdown() waits at most for its departure notice
  // (tcp::ControlKind::kLeaving) to leave this rank.
  static constexpr std::chrono::milliseconds kLeavingBudget{100};

  std::chrono::milliseconds timeout_;
  std::unique_ptr<tcp::Mesh> mesh_;
  std::unique_ptr<tcp::ControlChannel> control_;
  std::unique_ptr<tcp::PointToPoint> p2p_;
  // The collectives' temporary buffers, used by the task that holds the
  // scheduler's turn.
  std::unique_ptr<Workspace> workspace_;
  // Shared with the progress hooks of the Work handed out, which may
  // outlive this backend.
  std::shared_ptr<tcp::CollectiveScheduler> scheduler_;
  std::atomic<std::uint64_t> next_p2p_{0};
};

}  // namespace comm
