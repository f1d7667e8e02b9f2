// commdist_c10d::ProcessGroupLibcomm: a c10d::ProcessGroup (PyTorch 1.13's
// interface) over a comm::ProcessGroup, registered with torch.distributed
// as the backend "libcomm" by `import commdist.c10d`.
//
// Every call checks and translates its arguments on the caller's thread,
// hands the operation to libcomm and returns at once with a WorkLibcomm.
// The tensors are torch's own memory viewed as comm::Tensor without a
// copy; the exceptions are a non-contiguous tensor (staged through a
// contiguous copy and copied back when the operation completes) and the
// calls that take lists (coalesced, alltoall, allgather_coalesced), which
// are flattened into one buffer and split again afterwards. The staging
// copies are what gloo makes for the same calls.
//
// CPU tensors go over libcomm's TCP backend (shared memory between ranks
// on one host). CUDA tensors go over libcomm's NCCL backend, in a second
// libcomm group that the first call on CUDA tensors creates, from the same
// store under a scope of its own, bound to that call's device; the tensors
// of one call are all CPU tensors or all CUDA tensors of one device. How
// CUDA work is ordered with torch's streams is said in torch_cuda.h.
//
// Threads: torch's Python bindings release the GIL before calling here, and
// nothing below touches a Python object, so libcomm works without the GIL.
// A caller that waits on its Work runs the operation on its own thread, as
// libcomm's ProcessGroup allows. A Work whose Future is asked for (DDP's
// reducer asks for every bucket's) is also watched by the group's
// completion threads, one of which completes the Future, and runs the Future's
// callbacks, as soon as libcomm completes the operation.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "libcomm/distributed/process_group.h"

namespace commdist_c10d {

class CompletionThreads;
class Staging;

// A libcomm operation seen as a c10d::Work. Complete (isCompleted() true,
// the Future set) only once libcomm's Work is and the results are in the
// caller's tensors. wait(timeout) throws, without completing, when the
// operation is still running after `timeout`; an operation that failed
// rethrows libcomm's error, whose message names the rank, the call and
// its sequence number.
//
// On CUDA tensors, libcomm's Work is complete once the operation has run
// on the GPU, and the Future is a CUDA-aware one of the tensors' device.
// An unbounded wait() makes torch's current stream wait for the operation
// without blocking the host where TorchStreamScope can name that stream
// (orders_on_torch_streams()) and no results need copying out of staging
// buffers; otherwise it blocks the host until the operation is complete.
class WorkLibcomm final : public c10d::Work {
 public:
  // `epilogue` runs once after libcomm's operation succeeds, before the
  // Work completes: it copies results out of staging buffers. `outputs` is
  // what result() and the Future give. `cuda_device` is the CUDA ordinal of
  // the operation's tensors, or -1 for CPU tensors.
  WorkLibcomm(int rank, c10d::OpType type, std::shared_ptr<comm::Work> work,
              std::vector<at::Tensor> outputs, std::function<void()> epilogue,
              std::shared_ptr<CompletionThreads> completion, int cuda_device);
  ~WorkLibcomm() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Blocks the host until libcomm's operation is complete, whatever its
  // outcome.
  void wait_for_libcomm();
  // libcomm's operation, for CompletionThreads to be told of its
  // completion.
  comm::Work& libcomm_work() { return *work_; }
  // Whether the operation is a collective on CPU tensors, which the TCP
  // backend runs on the thread that waits for it, and otherwise on its
  // worker only after a grace (tcp::CollectiveScheduler): a receive or a
  // send progresses by itself, and an NCCL operation was launched as it
  // was issued.
  bool runs_where_waited_for() const;
  // Once libcomm's operation is complete: runs the epilogue, then completes
  // the Future (if one was made) and this Work. Only the first call does
  // anything.
  void complete();

 private:
  // complete() when libcomm's operation is done; for the const observers.
  void complete_if_done() const;
  c10::intrusive_ptr<c10::ivalue::Future> make_future() const;
  // Sets `future` to the outputs, or to `error`.
  void complete_future(c10::ivalue::Future& future, std::exception_ptr error);

  const std::shared_ptr<comm::Work> work_;
  const std::vector<at::Tensor> outputs_;
  std::function<void()> epilogue_;  // cleared by complete()
  const bool has_epilogue_;
  const std::shared_ptr<CompletionThreads> completion_;
  const int cuda_device_;
  std::atomic<bool> completing_{false};  // set by complete()'s first call
  std::atomic<bool> watched_{false};

  // The Future is made when it is first asked for (most Works are waited
  // on and never asked), except on CUDA tensors, where complete() must set
  // it on the thread, and so the stream, that ran the epilogue.
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // under future_mutex_
  // The operation's outcome once complete() knows it; under future_mutex_.
  bool outcome_known_ = false;
  std::exception_ptr outcome_error_;
};

// The threads that complete watched Works, and so run their epilogues, set
// their Futures and run the Futures' callbacks, off libcomm's own threads.
// libcomm hands a Work over once its operation has completed
// (comm::Work::on_completion), so a Work is completed as soon as libcomm
// has finished it, whatever the Works before it do: a receive that waits
// for its peer holds up no collective's Future, however many such
// receives are pending. One thread is kept free for the next Work: a
// thread that takes a Work while no other is free starts another (up to
// kMaxThreads), so a callback that waits for another Future of the group
// (PowerSGD's hook waits inside its callback) finds a thread to complete
// it. The threads own the pool (their bodies hold a shared_ptr), so a
// thread that drops the last reference from inside a Future callback can
// leave itself detached.
//
// A watched collective on CPU tensors is also waited for, oldest first, by
// one driver thread, so that it starts at once, as it would on a caller
// that waits for it (WorkLibcomm::runs_where_waited_for), instead of after
// the TCP backend's grace: DDP asks for every bucket's Future and waits
// for none. The collectives of a group run one at a time in issue order,
// so one thread drives them all; receives and sends are never driven, and
// a driver waiting for a collective holds up no other Future.
class CompletionThreads
    : public std::enable_shared_from_this<CompletionThreads> {
 public:
  static std::shared_ptr<CompletionThreads> start();
  // Completes `work` on one of the threads once libcomm has completed its
  // operation; at once on this thread once stop() has run. Throws
  // comm::BackendError, watching nothing, when no thread can be started.
  void watch(c10::intrusive_ptr<WorkLibcomm> work);
  // Waits until every watched Work is complete (the group shuts libcomm
  // down first, which completes them all) and the threads have ended. A
  // thread may need the GIL to run a Future's Python callbacks (DDP's comm
  // hooks) and drop their references, so the caller must not hold it.
  void stop();

  // Beyond this many Works whose completion runs at once (Future callbacks
  // that block), a completed Work waits for a free thread.
  static constexpr std::size_t kMaxThreads = 64;

 private:
  CompletionThreads() = default;
  // From libcomm's thread that completed `work`'s operation: queues it.
  void completed(c10::intrusive_ptr<WorkLibcomm> work);
  // Starts a thread, counted free until it takes a Work; false where the
  // system refused one. Under mutex_.
  bool start_thread();
  void run();
  // The driver's body.
  void drive();

  std::mutex mutex_;
  std::condition_variable changed_;
  // Works whose operation has completed, for the threads; under mutex_.
  std::deque<c10::intrusive_ptr<WorkLibcomm>> completed_;
  // Works watched and not yet taken by a thread; under mutex_.
  std::size_t watched_ = 0;
  // Threads waiting for a Work, or started to take one; under mutex_.
  std::size_t idle_ = 0;
  bool stopping_ = false;             // under mutex_
  std::vector<std::thread> threads_;  // under mutex_
  // Collectives for the driver, oldest first; under mutex_, as is the
  // driver, started with the first.
  std::condition_variable drive_changed_;
  std::deque<c10::intrusive_ptr<WorkLibcomm>> to_drive_;
  std::thread driver_;
};

class ProcessGroupLibcomm final : public c10d::ProcessGroup {
 public:
  // Joins the job through `store` (blocking until every rank of the group
  // has); `timeout` is every operation's default timeout. The NCCL group
  // for CUDA tensors is made by the first call on them.
  ProcessGroupLibcomm(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                      int size, std::chrono::milliseconds timeout);
  ~ProcessGroupLibcomm() override;

  // Shuts the group down: its pending operations fail, saying so, their
  // Futures are set, and the completion threads end. Later calls on the
  // group fail. Idempotent; the destructor calls it. commdist.c10d calls it
  // for every live group as the interpreter exits (atexit), while a
  // Future's Python callback can still run: once Python finalizes, a
  // thread that takes the GIL is ended by pthread_exit, which aborts the
  // process from inside torch's callback machinery.
  void close();

  // Runs `wait` (which blocks until the completion threads have ended) with
  // the GIL released when the calling thread holds it; set by module.cpp,
  // the one file that knows Python. Without it `wait` just runs.
  static void (*release_gil_while)(const std::function<void()>& wait);

  const std::string getBackendName() const override { return "libcomm"; }
  // The libcomm group of CPU tensors.
  const std::shared_ptr<comm::ProcessGroup>& group() const { return group_; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override;
  // A barrier within `opts.timeout`; a rank that does not arrive fails it
  // on every rank with libcomm's error naming that rank. (libcomm learns
  // which rank it is from the broken connection or the timeout, so
  // wait_all_ranks changes nothing.)
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool wait_all_ranks) override;

 private:
  // Issues `issue(group)` on the libcomm group of the call's tensors
  // (`staging` knows their device), ordered after torch's current stream
  // for CUDA tensors, and wraps libcomm's Work.
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, Staging& staging,
                                     std::vector<at::Tensor> outputs,
                                     Issue&& issue);
  // The libcomm group of CUDA tensors, made at the first call on them.
  comm::ProcessGroup& cuda_group(const char* call);

  const std::shared_ptr<comm::Store> store_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::shared_ptr<CompletionThreads> completion_;
  std::mutex cuda_mutex_;
  std::shared_ptr<comm::ProcessGroup> cuda_group_;  // under cuda_mutex_
};

}  // namespace commdist_c10d
