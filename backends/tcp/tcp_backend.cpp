#include "backends/tcp/tcp_backend.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>

#include "backends/tcp/collective_context.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/point_to_point.h"
#include "libcomm/detail/collective_args.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/param.h"
#include "libcomm/reduce_kernels.h"

namespace comm {

using detail::overlaps;
using tcp::CallInfo;
using tcp::Collective;
using tcp::CollectiveContext;

namespace {

// How long the worker leaves a new task to the caller: a caller that waits
// at once runs it on its own thread, without the two thread hand-offs that
// cost more than the whole call for small messages. Work nobody waits on
// starts this much later, which asynchronous callers do not notice. The
// grace is kAsyncGrace while the worker is starting tasks itself, and
// kWaitedGrace while callers run their own (see Scheduler).
constexpr std::chrono::nanoseconds kAsyncGrace = std::chrono::microseconds(100);
constexpr std::chrono::nanoseconds kWaitedGrace = std::chrono::milliseconds(1);

// Sets `timer` (a timerfd) to fire once after `delay`, or disarms it when
// `delay` is zero.
void arm_timer(int timer, std::chrono::nanoseconds delay) {
  itimerspec when{};
  if (delay.count() > 0) {
    when.it_value.tv_sec = static_cast<time_t>(delay.count() / 1000000000);
    when.it_value.tv_nsec = static_cast<long>(delay.count() % 1000000000);
  }
  timerfd_settime(timer, 0, &when, nullptr);
}

}  // namespace

// A queued collective and its Work in one allocation: named only when a
// name is needed, and run by a caller that waits on it (Scheduler::help).
class TcpBackend::Task final : public Work {
 public:
  Task(const CallInfo& info, std::chrono::milliseconds limit, Body body,
       int rank, std::weak_ptr<Scheduler> scheduler)
      : call(info),
        timeout(limit),
        queued_at(detail::Clock::now()),
        body_(std::move(body)),
        rank_(rank),
        scheduler_(std::move(scheduler)) {}

  // Hands the body over, once: it holds the call's tensors, which the Work
  // (that the caller may keep long after) must not keep alive.
  Body take_body() {
    Body body = std::move(body_);
    body_ = nullptr;
    return body;
  }

  const CallInfo call;
  const std::chrono::milliseconds timeout;
  const detail::Clock::time_point queued_at;

 private:
  std::string describe() const override {
    return call.describe() + " on rank " + std::to_string(rank_);
  }
  void progress() override;

  Body body_;
  const int rank_;
  std::weak_ptr<Scheduler> scheduler_;
};

// The collective queue and the turn to run it. One thread at a time holds
// the turn (`running`), so tasks run one after another in issue order,
// whether the worker or a waiting caller runs them.
//
// The worker is woken by a timer, not by every enqueue, and the timer is
// armed lazily: a task that finds it idle arms it for the grace, and
// nobody disarms it. A caller that waits at once runs its task itself, so
// a stream of waited-on calls costs one timer arm and one worker wake-up
// per grace period rather than two system calls and a thread hand-off per
// call; work nobody waits on is started when the timer fires.
//
// A wake-up that finds nothing to start, or the turn held by a caller
// (where a program that waits on every call spends most of its time), was
// wasted: on a virtual machine it stalls the thread it preempts for tens
// of microseconds, more than a small collective. So the grace is long,
// kWaitedGrace, at start-up and after any wasted wake-up, and short,
// kAsyncGrace, once the worker has had to start a task itself. (Starting
// short and doubling at each wasted wake-up cost a run of small blocking
// calls at start-up four wake-ups in its first 2 ms instead of two: its
// first 200 all_reduce calls of 1 KiB at world 2 took 10.9 us each
// against 9.8, medians of 10 alternating runs.) A wake-up that finds a task
// not yet due re-arms for it, so that the task is not put off again. A
// program that waits on every call then pays for one wake-up per
// millisecond, and one that does not has its work started within 100 us,
// or within 1 ms for its first task and the first after a run of
// waited-on calls.
struct TcpBackend::Scheduler {
  std::mutex mutex;
  std::condition_variable changed;  // `running` went false
  int timer_fd = -1;
  bool timer_armed = false;  // set until the worker has seen it fire
  std::chrono::nanoseconds grace = kWaitedGrace;
  std::deque<std::shared_ptr<Task>> queue;
  std::uint64_t next_sequence = 0;
  bool running = false;
  bool stopping = false;
  std::exception_ptr broken;  // the first failure; collectives refuse after it
  // Runs a task; set by the backend, never called once `stopping` is set.
  std::function<void(Task&)> execute;

  // The delay the caller, which holds `mutex`, must arm the timer with:
  // the grace for the first to find it idle, zero (do not arm) for the
  // others. The caller arms it after letting go of the mutex, so that no
  // system call runs inside the critical section that callers and the
  // worker share (a waiter that finds the mutex taken sleeps, and waking
  // it costs more than a small collective).
  std::chrono::nanoseconds claim_timer() {
    if (timer_armed) return std::chrono::nanoseconds(0);
    timer_armed = true;
    return grace;
  }

  // Makes sure the worker looks at the queue within the grace. Called with
  // `mutex` held, off the hot path.
  void wake_worker_later() {
    const std::chrono::nanoseconds delay = claim_timer();
    if (delay.count() > 0) arm_timer(timer_fd, delay);
  }

  // Runs queued tasks on the calling thread until `target` completes,
  // unless another thread holds the turn (then the caller just waits).
  void help(Work& target) {
    std::unique_lock<std::mutex> lock(mutex);
    while (!target.is_completed() && !stopping && !running && !queue.empty()) {
      std::shared_ptr<Task> task = std::move(queue.front());
      queue.pop_front();
      running = true;
      lock.unlock();
      execute(*task);
      lock.lock();
      running = false;
      changed.notify_all();
    }
    // Whatever is left belongs to the worker.
    if (!stopping && !queue.empty()) wake_worker_later();
  }
};

void TcpBackend::Task::progress() {
  if (auto alive = scheduler_.lock()) alive->help(*this);
}

namespace {

// The host memory a call works on: the tensor itself, or a host copy of a
// CUDA tensor (with its contents when `copy_in`).
Tensor on_host(const Tensor& tensor, bool copy_in) {
  if (tensor.device().is_cpu()) return tensor;
  return copy_in ? tensor.to(Device::cpu())
                 : Tensor::empty(tensor.shape(), tensor.dtype(), Device::cpu());
}

// The same without copying a CPU tensor's handle (which allocates its
// shape and strides): a CUDA tensor's host copy goes into `staged`, which
// must outlive the reference returned.
const Tensor& on_host(const Tensor& tensor, bool copy_in, Tensor& staged) {
  if (tensor.device().is_cpu()) return tensor;
  staged = on_host(tensor, copy_in);
  return staged;
}

// Copies a staged result back to its CUDA tensor (nothing for CPU ones).
void from_host(Tensor& tensor, const Tensor& host) {
  if (!tensor.device().is_cpu()) tensor.copy_(host);
}

std::uint8_t* bytes_of(const Tensor& tensor) {
  return static_cast<std::uint8_t*>(tensor.data_ptr());
}

}  // namespace

TcpBackend::TcpBackend(std::shared_ptr<Store> store, int rank, int size,
                       std::chrono::milliseconds timeout)
    : Backend(rank, size), timeout_(timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("TcpBackend: rank " + std::to_string(rank) +
                          " is outside [0, " + std::to_string(size) + ")");
  }
  // A malformed knob fails here, when the group is created, rather than in
  // the middle of the first collective that reads it.
  read_params("COMM_TCP_");
  read_params("COMM_REDUCE_");
  mesh_ = std::make_unique<tcp::Mesh>(*store, rank, size, timeout);
  p2p_ = std::make_unique<tcp::PointToPoint>(*mesh_);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw SystemError(errno, "eventfd");
  scheduler_ = std::make_shared<Scheduler>();
  scheduler_->execute = [this](Task& task) { execute(task); };
  scheduler_->timer_fd =
      timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (scheduler_->timer_fd < 0) throw SystemError(errno, "timerfd_create");
  worker_ = std::thread([this] { run_worker(); });
}

TcpBackend::~TcpBackend() {
  shutdown();
  close(wake_fd_);
  // The timer's descriptor stays with the scheduler, which a Work's hook may
  // still hold; a stopped scheduler never touches it again.
  close(scheduler_->timer_fd);
}

void TcpBackend::shutdown() {
  std::deque<std::shared_ptr<Task>> abandoned;
  {
    std::lock_guard<std::mutex> lock(scheduler_->mutex);
    if (scheduler_->stopping) return;
    scheduler_->stopping = true;
    abandoned.swap(scheduler_->queue);
  }
  const auto error = std::make_exception_ptr(BackendError(
      "the process group was shut down before this operation ran"));
  for (auto& task : abandoned) {
    task->take_body();
    task->finish(error);
  }
  // Interrupt a collective in progress (on the worker or a waiting
  // caller), wait until its thread gives the turn back, then stop.
  const std::uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  {
    std::unique_lock<std::mutex> lock(scheduler_->mutex);
    scheduler_->changed.notify_all();
    scheduler_->changed.wait(lock, [&] { return !scheduler_->running; });
  }
  if (worker_.joinable()) worker_.join();
  p2p_->stop(std::make_exception_ptr(BackendError(
      "the process group was shut down with this operation pending")));
  mesh_->shutdown_all();
}

void TcpBackend::check_open() const {
  if (scheduler_->stopping) {
    throw BackendError("the process group was shut down; create a new one");
  }
}

std::chrono::milliseconds TcpBackend::resolve(OpTimeout timeout) const {
  return timeout == kDefaultTimeout ? timeout_ : timeout;
}

std::shared_ptr<Work> TcpBackend::enqueue(CallInfo call, OpTimeout timeout,
                                          Body body) {
  std::shared_ptr<Task> task;
  std::chrono::nanoseconds arm{0};
  {
    std::lock_guard<std::mutex> lock(scheduler_->mutex);
    check_open();
    call.sequence = scheduler_->next_sequence++;
    task = std::make_shared<Task>(call, resolve(timeout), std::move(body),
                                  rank(), scheduler_);
    scheduler_->queue.push_back(task);
    arm = scheduler_->claim_timer();
  }
  if (arm.count() > 0) arm_timer(scheduler_->timer_fd, arm);
  return task;
}

void TcpBackend::run_worker() {
  Scheduler& s = *scheduler_;
  pollfd watched[2] = {{s.timer_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  // Runs until shutdown; each round sleeps in poll until the timer says a
  // task has waited its grace, or the backend shuts down.
  while (true) {
    if (::poll(watched, 2, -1) < 0 && errno != EINTR) return;
    if (watched[1].revents != 0) return;
    std::uint64_t expirations;
    (void)!read(s.timer_fd, &expirations, sizeof(expirations));
    std::unique_lock<std::mutex> lock(s.mutex);
    s.timer_armed = false;
    bool started = false;
    std::chrono::nanoseconds rearm{0};
    while (!s.stopping && !s.running && !s.queue.empty()) {
      const auto due = s.queue.front()->queued_at + s.grace;
      const auto now = detail::Clock::now();
      if (now < due) {
        // Armed below, outside the mutex; nobody else arms it meanwhile.
        rearm = due - now;
        s.timer_armed = true;
        break;
      }
      std::shared_ptr<Task> task = std::move(s.queue.front());
      s.queue.pop_front();
      s.running = true;
      s.grace = kAsyncGrace;  // nobody waited for this one
      started = true;
      lock.unlock();
      execute(*task);
      lock.lock();
      s.running = false;
      s.changed.notify_all();
    }
    if (!started && rearm.count() == 0) s.grace = kWaitedGrace;  // wasted
    if (s.stopping) return;
    lock.unlock();
    if (rearm.count() > 0) arm_timer(s.timer_fd, rearm);
  }
}

void TcpBackend::execute(Task& task) {
  const Body body = task.take_body();
  std::exception_ptr broken;
  {
    std::lock_guard<std::mutex> lock(scheduler_->mutex);
    broken = scheduler_->broken;
  }
  if (broken) {
    try {
      std::rethrow_exception(broken);
    } catch (const std::exception& e) {
      task.finish(std::make_exception_ptr(BackendError(
          task.call.describe() +
          " cannot run: the process group failed earlier: " + e.what())));
    }
    return;
  }
  CollectiveContext ctx{*mesh_, task.call, detail::deadline_after(task.timeout),
                        wake_fd_};
  try {
    body(ctx);
    task.finish();
  } catch (...) {
    const auto error = std::current_exception();
    if (!ctx.relayed) {
      // Tell the others why, so that they fail now rather than at their
      // timeouts. Best effort: a dead peer just misses it.
      ErrorKind kind = ErrorKind::kBackend;
      int culprit = rank();
      std::string message = "unknown error";
      try {
        std::rethrow_exception(error);
      } catch (const PeerError& e) {
        kind = e.kind();
        culprit = e.peer_rank();
        message = e.what();
      } catch (const Error& e) {
        kind = e.kind();
        message = e.what();
      } catch (const std::exception& e) {
        message = e.what();
      }
      COMM_LOG_ERROR("{} failed: {}", task.call.describe(), message);
      mesh_->broadcast_control(
          tcp::encode_abort(task.call, kind, culprit, message),
          std::chrono::milliseconds(200));
    }
    {
      std::lock_guard<std::mutex> lock(scheduler_->mutex);
      if (!scheduler_->broken) scheduler_->broken = error;
    }
    task.finish(error);
  }
}

std::shared_ptr<Work> TcpBackend::do_broadcast(Tensor& tensor,
                                            const BroadcastOptions& options) {
  CallInfo call{Collective::kBroadcast, 0,
                tensor.dtype(),         tensor.numel(),
                ReduceOp::kSum,         options.root};
  return enqueue(call, options.timeout,
                 [this, tensor, options](CollectiveContext& ctx) mutable {
                   const bool is_root = rank() == options.root;
                   Tensor staged;
                   const Tensor& host = on_host(tensor, is_root, staged);
                   tcp::broadcast(ctx, host.data_ptr(), host.nbytes(),
                                  options.root);
                   from_host(tensor, host);
                 });
}

std::shared_ptr<Work> TcpBackend::do_reduce(Tensor& tensor,
                                         const ReduceOptions& options) {
  CallInfo call{Collective::kReduce, 0,          tensor.dtype(),
                tensor.numel(),      options.op, options.root};
  return enqueue(call, options.timeout,
                 [this, tensor, options](CollectiveContext& ctx) mutable {
                   Tensor staged;
                   const Tensor& host = on_host(tensor, true, staged);
                   tcp::reduce(ctx, host.data_ptr(),
                               static_cast<std::size_t>(host.numel()),
                               host.dtype(), options.op, options.root);
                   if (rank() == options.root) {
                     if (options.op == ReduceOp::kAvg) {
                       divide_by(host.dtype(), host.data_ptr(),
                                 static_cast<std::size_t>(host.numel()),
                                 size());
                     }
                     from_host(tensor, host);
                   }
                 });
}

std::shared_ptr<Work> TcpBackend::do_all_reduce(Tensor& tensor,
                                             const AllReduceOptions& options) {
  return do_all_reduce_into(tensor, tensor, options);
}

std::shared_ptr<Work> TcpBackend::do_all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  // In place or not, the same call on the wire: ranks may mix the forms.
  CallInfo call{Collective::kAllReduce, 0,          input.dtype(),
                input.numel(),          options.op, -1};
  return enqueue(
      call, options.timeout,
      [this, output, input, options](CollectiveContext& ctx) mutable {
        const bool in_place = output.data_ptr() == input.data_ptr();
        Tensor staged_output, staged_input;
        const Tensor& host = on_host(output, in_place, staged_output);
        const Tensor& host_input =
            in_place ? host : on_host(input, true, staged_input);
        const auto count = static_cast<std::size_t>(host.numel());
        tcp::all_reduce(ctx, host_input.data_ptr(), host.data_ptr(), count,
                        host.dtype(), options.op);
        if (options.op == ReduceOp::kAvg)
          divide_by(host.dtype(), host.data_ptr(), count, size());
        from_host(output, host);
      });
}

std::shared_ptr<Work> TcpBackend::do_all_gather(std::vector<Tensor>& outputs,
                                             const Tensor& input,
                                             const AllGatherOptions& options) {
  CallInfo call{Collective::kAllGather, 0, input.dtype(), input.numel(),
                ReduceOp::kSum,         -1};
  return enqueue(
      call, options.timeout,
      [this, outputs, input](CollectiveContext& ctx) mutable {
        std::vector<Tensor> hosts;
        std::vector<void*> blocks;
        for (int r = 0; r < size(); ++r) {
          hosts.push_back(on_host(outputs[r], false));
          blocks.push_back(hosts.back().data_ptr());
        }
        hosts[rank()].copy_(on_host(input, true).view(hosts[rank()].shape()));
        tcp::all_gather(ctx, blocks, input.nbytes());
        for (int r = 0; r < size(); ++r) from_host(outputs[r], hosts[r]);
      });
}

std::shared_ptr<Work> TcpBackend::do_all_gather_into(
    Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  CallInfo call{Collective::kAllGather, 0, input.dtype(), input.numel(),
                ReduceOp::kSum,         -1};
  return enqueue(call, options.timeout,
                 [this, output, input](CollectiveContext& ctx) mutable {
                   Tensor host = on_host(output, false);
                   const std::size_t bytes = input.nbytes();
                   std::vector<void*> blocks;
                   for (int r = 0; r < size(); ++r)
                     blocks.push_back(bytes_of(host) + r * bytes);
                   Tensor mine = on_host(input, true);
                   if (bytes > 0)
                     std::memmove(blocks[rank()], mine.data_ptr(), bytes);
                   tcp::all_gather(ctx, blocks, bytes);
                   from_host(output, host);
                 });
}

std::shared_ptr<Work> TcpBackend::do_gather(std::vector<Tensor>& outputs,
                                         const Tensor& input,
                                         const GatherOptions& options) {
  CallInfo call{Collective::kGather, 0,           input.dtype(), input.numel(),
                ReduceOp::kSum,      options.root};
  return enqueue(
      call, options.timeout,
      [this, outputs, input, options](CollectiveContext& ctx) mutable {
        Tensor mine = on_host(input, true);
        std::vector<Tensor> hosts;
        std::vector<void*> blocks;
        for (Tensor& output : outputs) {
          hosts.push_back(on_host(output, false));
          blocks.push_back(hosts.back().data_ptr());
        }
        tcp::gather(ctx, mine.data_ptr(), blocks, input.nbytes(), options.root);
        for (std::size_t r = 0; r < outputs.size(); ++r)
          from_host(outputs[r], hosts[r]);
      });
}

std::shared_ptr<Work> TcpBackend::do_scatter(Tensor& output,
                                          const std::vector<Tensor>& inputs,
                                          const ScatterOptions& options) {
  CallInfo call{Collective::kScatter, 0,
                output.dtype(),       output.numel(),
                ReduceOp::kSum,       options.root};
  return enqueue(call, options.timeout,
                 [output, inputs, options](CollectiveContext& ctx) mutable {
                   Tensor host = on_host(output, false);
                   std::vector<Tensor> hosts;
                   std::vector<const void*> blocks;
                   for (const Tensor& input : inputs) {
                     hosts.push_back(on_host(input, true));
                     blocks.push_back(hosts.back().data_ptr());
                   }
                   tcp::scatter(ctx, blocks, host.data_ptr(), output.nbytes(),
                                options.root);
                   from_host(output, host);
                 });
}

std::shared_ptr<Work> TcpBackend::do_reduce_scatter(
    Tensor& output, const std::vector<Tensor>& inputs,
    const ReduceScatterOptions& options) {
  CallInfo call{Collective::kReduceScatter,
                0,
                output.dtype(),
                output.numel(),
                options.op,
                -1};
  return enqueue(
      call, options.timeout,
      [this, output, inputs, options](CollectiveContext& ctx) mutable {
        // The algorithm writes partial sums into the output before
        // it has read every input, so an output that is one of the
        // inputs (in place) gets a buffer of its own.
        const bool aliased =
            std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& in) {
              return in.data_ptr() == output.data_ptr();
            });
        Tensor host = aliased ? Tensor::empty(output.shape(), output.dtype())
                              : on_host(output, false);
        std::vector<Tensor> hosts;
        std::vector<const void*> blocks;
        for (const Tensor& input : inputs) {
          hosts.push_back(on_host(input, true));
          blocks.push_back(hosts.back().data_ptr());
        }
        const auto count = static_cast<std::size_t>(output.numel());
        tcp::reduce_scatter(ctx, blocks, host.data_ptr(), count, output.dtype(),
                            options.op);
        if (options.op == ReduceOp::kAvg) {
          divide_by(output.dtype(), host.data_ptr(), count, size());
        }
        if (aliased) {
          output.copy_(host);
        } else {
          from_host(output, host);
        }
      });
}

std::shared_ptr<Work> TcpBackend::do_all_to_all(Tensor& output,
                                             const Tensor& input,
                                             const AllToAllOptions& options) {
  // Checked by Backend::all_to_all; the TCP algorithm works in bytes.
  detail::AllToAllLayout layout =
      detail::all_to_all_layout(output, input, options.input_split_sizes,
                                options.output_split_sizes, size());
  for (detail::Splits* s : {&layout.sends, &layout.receives}) {
    for (auto& v : s->offsets) v *= input.element_size();
    for (auto& v : s->counts) v *= input.element_size();
  }
  const detail::Splits& sends = layout.sends;
  const detail::Splits& receives = layout.receives;
  const auto& send_offsets = sends.offsets;
  const auto& send_bytes = sends.counts;
  const auto& recv_offsets = receives.offsets;
  const auto& recv_bytes = receives.counts;
  CallInfo call{Collective::kAllToAll, 0, input.dtype(), 0, ReduceOp::kSum, -1};
  return enqueue(call, options.timeout,
                 [output, input, send_offsets, send_bytes, recv_offsets,
                  recv_bytes](CollectiveContext& ctx) mutable {
                   Tensor in = on_host(input, true);
                   Tensor out = on_host(output, false);
                   // In place (one buffer for both), a block received
                   // early would overwrite one not yet sent: send from a
                   // copy.
                   if (overlaps(in, out)) in = in.clone();
                   tcp::all_to_all(ctx, bytes_of(in), send_offsets, send_bytes,
                                   bytes_of(out), recv_offsets, recv_bytes);
                   from_host(output, out);
                 });
}

std::shared_ptr<Work> TcpBackend::do_barrier(const BarrierOptions& options) {
  CallInfo call{Collective::kBarrier, 0, DType::kU8, 0, ReduceOp::kSum, -1};
  return enqueue(call, options.timeout,
                 [](CollectiveContext& ctx) { tcp::barrier(ctx); });
}

std::shared_ptr<Work> TcpBackend::point_to_point_work(const char* kind,
                                                      const Tensor& tensor,
                                                      int tag,
                                                      const std::string& peer) {
  std::uint64_t id;
  {
    std::lock_guard<std::mutex> lock(scheduler_->mutex);
    check_open();
    id = next_p2p_++;
  }
  return std::make_shared<Work>(std::string(kind) + " #" + std::to_string(id) +
                                " (" + dtype_name(tensor.dtype()) + " x " +
                                std::to_string(tensor.numel()) + ", tag " +
                                std::to_string(tag) + ") " + peer);
}

std::shared_ptr<Work> TcpBackend::do_send(const Tensor& tensor, int dst,
                                       const SendOptions& options) {
  auto work = point_to_point_work("send", tensor, options.tag,
                                  "to rank " + std::to_string(dst));
  // A CUDA tensor is copied to the host now; the copy travels with the send.
  auto host = std::make_shared<Tensor>(on_host(tensor, true));
  p2p_->post_send(work, host, dst, options.tag, tensor.dtype(),
                  host->data_ptr(), host->nbytes(),
                  detail::deadline_after(resolve(options.timeout)));
  return work;
}

std::shared_ptr<Work> TcpBackend::do_recv(Tensor& tensor, int src,
                                       const RecvOptions& options) {
  auto work = point_to_point_work("recv", tensor, options.tag,
                                  src == kAnySource
                                      ? std::string("from any rank")
                                      : "from rank " + std::to_string(src));
  // A CUDA tensor receives into a host copy, copied over when it arrives.
  auto host = std::make_shared<Tensor>(on_host(tensor, false));
  std::function<void()> copy_back;
  if (!tensor.device().is_cpu()) {
    copy_back = [tensor, host]() mutable { tensor.copy_(*host); };
  }
  p2p_->post_recv(work, host, src, options.tag, tensor.dtype(),
                  host->data_ptr(), host->nbytes(),
                  detail::deadline_after(resolve(options.timeout)),
                  std::move(copy_back));
  return work;
}

}  // namespace comm
