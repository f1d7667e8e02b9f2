#include "process_group_libcomm.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "libcomm/error.h"
#include "torch_cuda.h"
#include "torch_store.h"

namespace commdist_c10d {
namespace {

// Whether a call's caller may leave it running (comm's async_op): the
// options of newer torch versions say so in asyncOp, false when
// torch.distributed waits for the call at once; older ones say nothing,
// which promises nothing.
template <typename TorchOptions>
bool async_op_of(const TorchOptions& opts) {
  if constexpr (requires { opts.asyncOp; }) {
    return opts.asyncOp;
  } else {
    return true;
  }
}

std::string where(const char* call) {
  return std::string("libcomm's torch backend, ") + call + ": ";
}

comm::DType dtype_of(const at::Tensor& tensor, const char* call) {
  switch (tensor.scalar_type()) {
    case at::kHalf: return comm::DType::kF16;
    case at::kBFloat16: return comm::DType::kBF16;
    case at::kFloat: return comm::DType::kF32;
    case at::kDouble: return comm::DType::kF64;
    case at::kChar: return comm::DType::kI8;
    case at::kByte: return comm::DType::kU8;
    case at::kInt: return comm::DType::kI32;
    case at::kLong: return comm::DType::kI64;
    case at::kBool: return comm::DType::kBool;
    default:
      throw comm::UnsupportedError(
          where(call) + "dtype " +
          std::string(c10::toString(tensor.scalar_type())) +
          " is not supported: libcomm moves float16, bfloat16, float32, "
          "float64, int8, uint8, int32, int64 and bool tensors (a complex "
          "tensor can be passed as torch.view_as_real(tensor))");
  }
}

comm::ReduceOp op_of(const c10d::ReduceOp& op, const char* call) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return comm::ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return comm::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return comm::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN: return comm::ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return comm::ReduceOp::kMax;
    case c10d::ReduceOp::BAND: return comm::ReduceOp::kBand;
    case c10d::ReduceOp::BOR: return comm::ReduceOp::kBor;
    case c10d::ReduceOp::BXOR: return comm::ReduceOp::kBxor;
    case c10d::ReduceOp::PREMUL_SUM:
      throw comm::UnsupportedError(
          where(call) +
          "PREMUL_SUM is not supported (it is NCCL's); multiply the tensor "
          "by the factor and reduce with SUM");
    default:
      throw comm::UnsupportedError(where(call) + "reduce op " +
                                   std::to_string(int(op.op_)) +
                                   " is not supported");
  }
}

// Views a contiguous CPU or CUDA tensor as a comm::Tensor without a copy.
// The view keeps torch's storage alive (not the Python tensor object, so
// dropping it never needs the GIL) until libcomm lets go of it, which for
// CUDA memory is once the operation has run on the GPU.
comm::Tensor view_of(const at::Tensor& tensor, const char* call) {
  comm::DType dtype = dtype_of(tensor, call);
  comm::Shape shape(tensor.sizes().begin(), tensor.sizes().end());
  const comm::Device device = tensor.is_cuda()
                                  ? comm::Device::cuda(tensor.device().index())
                                  : comm::Device::cpu();
  return comm::Tensor::from_blob(tensor.data_ptr(), shape, dtype, device,
                                 [storage = tensor.storage()](void*) {});
}

// Whether two of `tensors`, all on one device, may share a byte: each is
// taken to span its memory from its first element to its last, so two
// interleaved views (t[0::2], t[1::2]) count as sharing, which only costs
// them a staging copy.
bool share_memory(const std::vector<at::Tensor>& tensors) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> extents;
  extents.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    if (tensor.numel() == 0) continue;
    std::int64_t span = 1;  // elements from the first to the last
    for (std::int64_t d = 0; d < tensor.dim(); ++d) {
      span += (tensor.size(d) - 1) * tensor.stride(d);
    }
    const auto start = reinterpret_cast<std::uintptr_t>(tensor.data_ptr());
    extents.emplace_back(start,
                         start + std::uintptr_t(span) * tensor.element_size());
  }
  std::sort(extents.begin(), extents.end());
  std::uintptr_t reach = 0;  // the furthest end so far
  for (const auto& [start, end] : extents) {
    if (start < reach) return true;
    reach = std::max(reach, end);
  }
  return false;
}

}  // namespace

// Builds the comm::Tensors of one call, staging non-contiguous tensors
// through contiguous copies, and the epilogue that copies results back.
// Every tensor it is given is checked: dense, and on the CPU or on CUDA,
// all of the call's on the same device.
class Staging {
 public:
  explicit Staging(const char* call) : call_(call) {}

  const char* call() const { return call_; }
  // The CUDA ordinal of the call's tensors, or -1 for CPU tensors.
  int cuda_device() const { return cuda_device_; }

  void check(const at::Tensor& tensor) {
    if (!tensor.defined()) {
      throw comm::InvalidArgument(where(call_) + "a tensor is undefined");
    }
    if (tensor.layout() != at::kStrided) {
      throw comm::UnsupportedError(
          where(call_) + "only dense (strided) tensors are supported");
    }
    const at::Device device = tensor.device();
    if (!device.is_cpu() && !device.is_cuda()) {
      throw comm::UnsupportedError(
          where(call_) + "the tensor is on " + device.str() +
          "; this backend serves CPU and CUDA tensors");
    }
    if (!first_device_) {
      first_device_ = device;
      cuda_device_ = device.is_cuda() ? device.index() : -1;
    } else if (device != *first_device_) {
      throw comm::InvalidArgument(
          where(call_) + "a tensor on " + first_device_->str() +
          " and one on " + device.str() +
          " in one call; the tensors of a call must all be CPU tensors or "
          "all CUDA tensors on one device");
    }
  }

  comm::Tensor input(const at::Tensor& tensor) {
    check(tensor);
    return view_of(tensor.contiguous(), call_);
  }

  // Checked before the operation runs, so that every rank of an SPMD
  // program refuses the call, where failing only in the epilogue would
  // leave this rank's result lost after its peers had theirs.
  void check_writable(const at::Tensor& tensor) {
    check(tensor);
    if (at::has_internal_overlap(tensor) == at::MemOverlap::Yes) {
      throw comm::InvalidArgument(
          where(call_) +
          "an output tensor has elements that share memory (an expanded "
          "view, or a stride of 0), so it cannot hold a result in each "
          "element; pass a tensor whose elements have memory of their own "
          "(.clone() makes one)");
    }
  }

  comm::Tensor output(const at::Tensor& tensor) {
    check_writable(tensor);
    return view_of_checked_output(tensor);
  }

  // A list of outputs, one per rank. Where two may share memory (`[t] *
  // world`; see share_memory), libcomm would refuse them, while gloo
  // copies its results out of one flat buffer in rank order, leaving the
  // last rank's where they overlap: every output is then staged and
  // copied back in that order, so the program gets what gloo gives it.
  std::vector<comm::Tensor> outputs(const std::vector<at::Tensor>& targets) {
    for (const at::Tensor& target : targets) check_writable(target);
    std::vector<comm::Tensor> views;
    views.reserve(targets.size());
    const bool shared = share_memory(targets);
    for (const at::Tensor& target : targets) {
      if (!shared) {
        views.push_back(view_of_checked_output(target));
        continue;
      }
      at::Tensor staged = at::empty_like(target, at::MemoryFormat::Contiguous);
      copy_back(target, staged);
      views.push_back(view_of(staged, call_));
    }
    return views;
  }

  // After the operation: `destination` receives `source` (of as many
  // elements), reshaped to `destination`'s shape.
  void copy_back(at::Tensor destination, at::Tensor source) {
    copies_.emplace_back(std::move(destination), std::move(source));
  }

  // The copies run on the current stream of the thread that completes the
  // Work; a CUDA staging buffer is then recorded on that stream, since it
  // was allocated on the stream current where the call was made.
  std::function<void()> epilogue() {
    if (copies_.empty()) return {};
    return [copies = std::move(copies_)] {
      for (const auto& [destination, source] : copies) {
        destination.copy_(source.view(destination.sizes()));
        record_on_current_stream(source);
      }
    };
  }

  // One flat contiguous tensor holding `tensors` one after another, all of
  // one dtype, which is checked.
  at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
    if (tensors.empty()) {
      throw comm::InvalidArgument(where(call_) + "the tensor list is empty");
    }
    std::vector<at::Tensor> flat;
    flat.reserve(tensors.size());
    for (const at::Tensor& tensor : tensors) {
      check(tensor);
      if (tensor.scalar_type() != tensors.front().scalar_type()) {
        throw comm::InvalidArgument(
            where(call_) + "the tensors must share one dtype; got " +
            std::string(c10::toString(tensors.front().scalar_type())) +
            " and " + std::string(c10::toString(tensor.scalar_type())));
      }
      flat.push_back(tensor.reshape({-1}));
    }
    return at::cat(flat);
  }

  // After the operation: the tensors receive `flat`'s elements from
  // `offset` on, one after another.
  void unflatten(const std::vector<at::Tensor>& tensors, const at::Tensor& flat,
                 std::int64_t offset = 0) {
    for (const at::Tensor& tensor : tensors) {
      check_writable(tensor);
      copy_back(tensor, flat.narrow(0, offset, tensor.numel()));
      offset += tensor.numel();
    }
  }

 private:
  // output() past its check: the tensor itself where it is contiguous,
  // else a staging copy.
  comm::Tensor view_of_checked_output(const at::Tensor& tensor) {
    if (tensor.is_contiguous()) return view_of(tensor, call_);
    at::Tensor staged = tensor.contiguous();
    copy_back(tensor, staged);
    return view_of(staged, call_);
  }

  const char* call_;
  std::optional<at::Device> first_device_;
  int cuda_device_ = -1;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_;
};

namespace {

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* call) {
  if (tensors.size() != 1) {
    throw comm::InvalidArgument(where(call) +
                                "takes one tensor per rank, got " +
                                std::to_string(tensors.size()) +
                                " (libcomm serves one device per process)");
  }
  return tensors.front();
}

std::vector<at::Tensor>& per_rank(std::vector<std::vector<at::Tensor>>& lists,
                                  int size, const char* call,
                                  const char* what) {
  if (lists.size() != 1 || lists.front().size() != std::size_t(size)) {
    throw comm::InvalidArgument(where(call) + what + " must be one list of " +
                                std::to_string(size) +
                                " tensors (one per rank)");
  }
  return lists.front();
}

bool empty_lists(const std::vector<std::vector<at::Tensor>>& lists) {
  for (const auto& list : lists) {
    if (!list.empty()) return false;
  }
  return true;
}

void check_root(int64_t root_tensor, const char* call) {
  if (root_tensor != 0) {
    throw comm::InvalidArgument(where(call) +
                                "rootTensor must be 0 (one tensor per rank)");
  }
}

}  // namespace

// ---- WorkLibcomm -----------------------------------------------------------

namespace {

// Blocks the host until `work` is complete, whatever its outcome. An
// operation has a timeout of its own, so this ends; it waits in long
// bounded steps because the NCCL backend's unbounded wait() does not block
// the host.
void wait_on_host(comm::Work& work) {
  while (!work.is_completed()) {
    try {
      work.wait(std::chrono::hours(1));
    } catch (...) {
      // The operation's error (complete() delivers it) or the hour passed.
    }
  }
}

}  // namespace

WorkLibcomm::WorkLibcomm(int rank, c10d::OpType type,
                         std::shared_ptr<comm::Work> work,
                         std::vector<at::Tensor> outputs,
                         std::function<void()> epilogue,
                         std::shared_ptr<CompletionThreads> completion,
                         int cuda_device)
    : c10d::Work(rank, type),
      work_(std::move(work)),
      outputs_(std::move(outputs)),
      epilogue_(std::move(epilogue)),
      has_epilogue_(bool(epilogue_)),
      completion_(std::move(completion)),
      cuda_device_(cuda_device) {
  if (cuda_device_ >= 0) future_ = make_future();
}

WorkLibcomm::~WorkLibcomm() = default;

c10::intrusive_ptr<c10::ivalue::Future> WorkLibcomm::make_future() const {
  std::vector<c10::Device> devices;
  if (cuda_device_ >= 0) {
    devices.emplace_back(c10::DeviceType::CUDA,
                         static_cast<c10::DeviceIndex>(cuda_device_));
  }
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                  std::move(devices));
}

void WorkLibcomm::complete_future(c10::ivalue::Future& future,
                                  std::exception_ptr error) {
  if (error) {
    future.setError(error);
  } else {
    future.markCompleted(c10::IValue(outputs_));
  }
}

void WorkLibcomm::complete() {
  // The first caller runs the epilogue and completes the Future and the
  // Work; the others return at once (wait() then waits for c10d::Work's
  // completion). The Future's callbacks (a DDP comm hook, in Python) run
  // on that first thread, under no lock, so that a thread that holds the
  // GIL and asks isCompleted() never waits for a callback that needs the
  // GIL. (std::call_once would cost a futex wake-up on every call.)
  if (completing_.exchange(true, std::memory_order_acq_rel)) return;
  std::exception_ptr error = work_->exception();
  if (!error && epilogue_) {
    try {
      epilogue_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  epilogue_ = nullptr;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    outcome_known_ = true;
    outcome_error_ = error;
    future = future_;
  }
  // A Future made after this point is set by getFuture().
  if (future) complete_future(*future, error);
  finish(error);
}

void WorkLibcomm::complete_if_done() const {
  // complete() only publishes what libcomm has already decided; it is
  // const in what an observer can see.
  if (work_->is_completed()) const_cast<WorkLibcomm*>(this)->complete();
}

bool WorkLibcomm::isCompleted() {
  complete_if_done();
  return c10d::Work::isCompleted();
}

bool WorkLibcomm::isSuccess() const {
  complete_if_done();
  return const_cast<WorkLibcomm*>(this)->c10d::Work::isCompleted() &&
         c10d::Work::isSuccess();
}

std::exception_ptr WorkLibcomm::exception() const {
  complete_if_done();
  return c10d::Work::exception();
}

int WorkLibcomm::sourceRank() const {
  if (opType_ != c10d::OpType::RECV && opType_ != c10d::OpType::RECVANYSOURCE) {
    return c10d::Work::sourceRank();  // throws, as torch's Works do
  }
  return work_->source_rank();
}

std::vector<at::Tensor> WorkLibcomm::result() { return outputs_; }

bool WorkLibcomm::runs_where_waited_for() const {
  return cuda_device_ < 0 && opType_ != c10d::OpType::SEND &&
         opType_ != c10d::OpType::RECV &&
         opType_ != c10d::OpType::RECVANYSOURCE;
}

bool WorkLibcomm::wait(std::chrono::milliseconds timeout) {
  const bool unbounded = timeout == ::kNoTimeout;
  try {
    if (cuda_device_ < 0 || !unbounded) {
      // Waiting at once on CPU tensors runs the operation on this thread
      // (libcomm's fast path); a bounded wait blocks the host. A failed
      // operation throws here and again below.
      work_->wait(unbounded ? comm::Work::kNoTimeout : timeout);
    } else if (orders_on_torch_streams() && !has_epilogue_) {
      // Torch's current stream waits for the operation; the host goes on,
      // and the Work completes when the GPU is done.
      TorchStreamScope scope(cuda_device_);
      work_->wait(comm::Work::kNoTimeout);
      return true;
    } else {
      wait_on_host(*work_);
    }
  } catch (...) {
    if (!work_->is_completed()) throw;  // timed out; the operation goes on
  }
  complete();
  return c10d::Work::wait(::kNoTimeout);
}

void WorkLibcomm::wait_for_libcomm() {
  if (cuda_device_ >= 0) {
    wait_on_host(*work_);
    return;
  }
  try {
    work_->wait(comm::Work::kNoTimeout);
  } catch (...) {
    // The error is the operation's; complete() delivers it.
  }
}

c10::intrusive_ptr<c10::ivalue::Future> WorkLibcomm::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool set_now = false;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (!future_) {
      future_ = make_future();
      // complete() has run without a Future to set.
      set_now = outcome_known_;
      error = outcome_error_;
    }
    future = future_;
  }
  if (set_now) complete_future(*future, error);
  if (!watched_.exchange(true)) {
    if (work_->is_completed()) {
      complete();
    } else {
      completion_->watch(c10::intrusive_ptr<WorkLibcomm>::reclaim_copy(this));
    }
  }
  return future;
}

// ---- CompletionThreads -----------------------------------------------------

std::shared_ptr<CompletionThreads> CompletionThreads::start() {
  return std::shared_ptr<CompletionThreads>(new CompletionThreads());
}

void CompletionThreads::watch(c10::intrusive_ptr<WorkLibcomm> work) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) {
      // The group has shut libcomm down, which completed every Work.
      lock.unlock();
      work->wait_for_libcomm();
      work->complete();
      return;
    }
    if (threads_.empty() && !start_thread()) {
      throw comm::BackendError(
          "commdist: could not start a thread to complete Futures (the "
          "process may be at its limit of threads)");
    }
    ++watched_;
    if (work->runs_where_waited_for()) {
      if (!driver_.joinable()) {
        try {
          driver_ = std::thread([self = shared_from_this()] { self->drive(); });
        } catch (const std::system_error&) {
          // Undriven, the collective still starts, after the grace.
        }
      }
      if (driver_.joinable()) {
        to_drive_.push_back(work);
        drive_changed_.notify_one();
      }
    }
  }
  comm::Work& libcomm = work->libcomm_work();
  // Moved on, so that the callback holds no reference once it has run:
  // the last one may be dropped on a completion thread, not on libcomm's.
  libcomm.on_completion(
      [pool = shared_from_this(), work = std::move(work)]() mutable {
        pool->completed(std::move(work));
      });
}

void CompletionThreads::completed(c10::intrusive_ptr<WorkLibcomm> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_.push_back(std::move(work));
  }
  changed_.notify_one();
}

bool CompletionThreads::start_thread() {
  try {
    threads_.emplace_back([self = shared_from_this()] { self->run(); });
  } catch (const std::system_error&) {
    return false;
  }
  ++idle_;  // the new thread's, until it takes a Work
  return true;
}

void CompletionThreads::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    threads.swap(threads_);
    if (driver_.joinable()) threads.push_back(std::move(driver_));
  }
  changed_.notify_all();
  drive_changed_.notify_all();
  // A Future callback may drop the last reference to the group; a thread
  // cannot join itself, and it ends on its own once nothing is watched.
  for (std::thread& thread : threads) {
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();
    } else {
      thread.join();
    }
  }
}

void CompletionThreads::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] {
      return !completed_.empty() || (stopping_ && watched_ == 0);
    });
    if (completed_.empty()) {
      --idle_;
      return;
    }
    c10::intrusive_ptr<WorkLibcomm> work = std::move(completed_.front());
    completed_.pop_front();
    --watched_;
    --idle_;
    // Keep one thread free while this one runs callbacks that may block;
    // where the system refuses one, the next thread to finish takes over.
    if (idle_ == 0 && !stopping_ && threads_.size() < kMaxThreads) {
      start_thread();
    }
    lock.unlock();
    work->complete();
    work.reset();  // its last reference may be the group's: not under the lock
    lock.lock();
    ++idle_;
    if (stopping_ && watched_ == 0) changed_.notify_all();
  }
}

void CompletionThreads::drive() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    drive_changed_.wait(lock, [&] { return stopping_ || !to_drive_.empty(); });
    if (to_drive_.empty()) return;  // stopping
    c10::intrusive_ptr<WorkLibcomm> work = std::move(to_drive_.front());
    to_drive_.pop_front();
    lock.unlock();
    // Runs the collectives queued up to this one, or waits while another
    // thread does; once stopping, libcomm has completed them all.
    work->wait_for_libcomm();
    work.reset();
    lock.lock();
  }
}

// ---- ProcessGroupLibcomm ---------------------------------------------------

ProcessGroupLibcomm::ProcessGroupLibcomm(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size),
      store_(std::make_shared<TorchStore>(store, timeout)),
      timeout_(timeout),
      group_(std::make_shared<comm::ProcessGroup>(store_, rank, size, "tcp",
                                                  timeout, "torch")),
      completion_(CompletionThreads::start()) {
  init();
}

ProcessGroupLibcomm::~ProcessGroupLibcomm() { close(); }

void ProcessGroupLibcomm::close() {
  // Shutting libcomm down completes every queued operation (with an error),
  // so the completion threads drain and end.
  try {
    group_->shutdown();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(cuda_mutex_);
    try {
      if (cuda_group_) cuda_group_->shutdown();
    } catch (...) {
    }
  }
  if (release_gil_while != nullptr) {
    release_gil_while([this] { completion_->stop(); });
  } else {
    completion_->stop();
  }
}

void (*ProcessGroupLibcomm::release_gil_while)(
    const std::function<void()>& wait) = nullptr;

comm::ProcessGroup& ProcessGroupLibcomm::cuda_group(const char* call) {
  std::lock_guard<std::mutex> lock(cuda_mutex_);
  if (!cuda_group_) {
    // Its own scope of the store, beside the CPU group's "torch"; the NCCL
    // backend binds to a device, and meets its peers, at its first call.
    try {
      cuda_group_ = std::make_shared<comm::ProcessGroup>(
          store_, getRank(), getSize(), "nccl", timeout_, "torch-cuda");
    } catch (const comm::UnsupportedError& error) {
      throw comm::UnsupportedError(
          where(call) +
          "CUDA tensors go over libcomm's NCCL backend: " + error.what());
    }
  }
  return *cuda_group_;
}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::run(
    c10d::OpType type, Staging& staging, std::vector<at::Tensor> outputs,
    Issue&& issue) {
  const int device = staging.cuda_device();
  std::shared_ptr<comm::Work> work;
  if (device < 0) {
    work = issue(*group_);
  } else {
    comm::ProcessGroup& group = cuda_group(staging.call());
    TorchStreamScope scope(device);
    work = issue(group);
  }
  return c10::make_intrusive<WorkLibcomm>(
      getRank(), type, std::move(work), std::move(outputs), staging.epilogue(),
      completion_, device);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  constexpr const char* call = "broadcast";
  check_root(opts.rootTensor, call);
  Staging staging(call);
  // The root's tensor is only read: staged, it needs no copy back, and an
  // expanded one is fine.
  at::Tensor& target = single(tensors, call);
  comm::Tensor tensor = opts.rootRank == getRank() ? staging.input(target)
                                                   : staging.output(target);
  return run(c10d::OpType::BROADCAST, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.broadcast(tensor, {.root = int(opts.rootRank),
                                               .timeout = opts.timeout,
                                               .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  constexpr const char* call = "allreduce";
  Staging staging(call);
  comm::Tensor tensor = staging.output(single(tensors, call));
  return run(c10d::OpType::ALLREDUCE, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.all_reduce(tensor,
                                       {.op = op_of(opts.reduceOp, call),
                                        .timeout = opts.timeout,
                                        .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* call = "allreduce_coalesced";
  Staging staging(call);
  at::Tensor flat = staging.flatten(tensors);
  staging.unflatten(tensors, flat);
  comm::Tensor tensor = view_of(flat, call);
  return run(c10d::OpType::ALLREDUCE_COALESCED, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.all_reduce(tensor,
                                       {.op = op_of(opts.reduceOp, call),
                                        .timeout = opts.timeout,
                                        .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  constexpr const char* call = "reduce";
  check_root(opts.rootTensor, call);
  Staging staging(call);
  // Only the root's tensor receives the result (what another rank's holds
  // afterwards is unspecified, as in c10d): staged, a non-root's needs no
  // copy back, and an expanded one is fine.
  at::Tensor& target = single(tensors, call);
  comm::Tensor tensor = opts.rootRank == getRank() ? staging.output(target)
                                                   : staging.input(target);
  return run(c10d::OpType::REDUCE, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.reduce(tensor, {.root = int(opts.rootRank),
                                            .op = op_of(opts.reduceOp, call),
                                            .timeout = opts.timeout,
                                            .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  constexpr const char* call = "allgather";
  Staging staging(call);
  comm::Tensor input = staging.input(single(inputs, call));
  std::vector<at::Tensor>& targets =
      per_rank(outputs, getSize(), call, "the output");
  std::vector<comm::Tensor> views = staging.outputs(targets);
  return run(c10d::OpType::ALLGATHER, staging, targets,
             [&](comm::ProcessGroup& group) {
               return group.all_gather(
                   views, input,
                   {.timeout = opts.timeout, .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  constexpr const char* call = "_allgather_base";
  Staging staging(call);
  comm::Tensor in = staging.input(input);
  comm::Tensor out = staging.output(output);
  return run(c10d::OpType::_ALLGATHER_BASE, staging, {output},
             [&](comm::ProcessGroup& group) {
               return group.all_gather_into(
                   out, in,
                   {.timeout = opts.timeout, .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  constexpr const char* call = "allgather_coalesced";
  Staging staging(call);
  at::Tensor flat_input = staging.flatten(inputs);
  if (outputs.size() != std::size_t(getSize())) {
    throw comm::InvalidArgument(
        where(call) + "the output must hold " + std::to_string(getSize()) +
        " lists (one per rank), got " + std::to_string(outputs.size()));
  }
  std::vector<at::Tensor> results;
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size()) {
      throw comm::InvalidArgument(
          where(call) + "output list " + std::to_string(r) + " holds " +
          std::to_string(outputs[r].size()) + " tensors; the input list " +
          std::to_string(inputs.size()));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (outputs[r][i].numel() != inputs[i].numel() ||
          outputs[r][i].scalar_type() != inputs[i].scalar_type()) {
        throw comm::InvalidArgument(
            where(call) + "output " + std::to_string(r) + "[" +
            std::to_string(i) + "] differs from input " + std::to_string(i) +
            " in element count or dtype");
      }
    }
  }
  at::Tensor flat_output =
      flat_input.new_empty({flat_input.numel() * getSize()});
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    staging.unflatten(outputs[r], flat_output, r * flat_input.numel());
    results.insert(results.end(), outputs[r].begin(), outputs[r].end());
  }
  comm::Tensor in = view_of(flat_input, call);
  comm::Tensor out = view_of(flat_output, call);
  return run(c10d::OpType::ALLGATHER_COALESCED, staging, std::move(results),
             [&](comm::ProcessGroup& group) {
               return group.all_gather_into(
                   out, in,
                   {.timeout = opts.timeout, .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  constexpr const char* call = "gather";
  Staging staging(call);
  comm::Tensor input = staging.input(single(inputs, call));
  std::vector<comm::Tensor> views;
  std::vector<at::Tensor> results;
  if (opts.rootRank == getRank()) {
    results = per_rank(outputs, getSize(), call, "the root's output");
    views = staging.outputs(results);
  } else if (!empty_lists(outputs)) {
    throw comm::InvalidArgument(where(call) +
                                "only the root rank passes output tensors");
  }
  return run(c10d::OpType::GATHER, staging, std::move(results),
             [&](comm::ProcessGroup& group) {
               return group.gather(views, input,
                                   {.root = int(opts.rootRank),
                                    .timeout = opts.timeout,
                                    .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  constexpr const char* call = "scatter";
  Staging staging(call);
  comm::Tensor output = staging.output(single(outputs, call));
  std::vector<comm::Tensor> views;
  if (opts.rootRank == getRank()) {
    for (const at::Tensor& source :
         per_rank(inputs, getSize(), call, "the root's input")) {
      views.push_back(staging.input(source));
    }
  } else if (!empty_lists(inputs)) {
    throw comm::InvalidArgument(where(call) +
                                "only the root rank passes input tensors");
  }
  return run(c10d::OpType::SCATTER, staging, outputs,
             [&](comm::ProcessGroup& group) {
               return group.scatter(output, views,
                                    {.root = int(opts.rootRank),
                                     .timeout = opts.timeout,
                                     .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  constexpr const char* call = "reduce_scatter";
  Staging staging(call);
  comm::Tensor output = staging.output(single(outputs, call));
  std::vector<comm::Tensor> views;
  for (const at::Tensor& source :
       per_rank(inputs, getSize(), call, "the input")) {
    views.push_back(staging.input(source));
  }
  return run(c10d::OpType::REDUCE_SCATTER, staging, outputs,
             [&](comm::ProcessGroup& group) {
               return group.reduce_scatter(output, views,
                                           {.op = op_of(opts.reduceOp, call),
                                            .timeout = opts.timeout,
                                            .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  constexpr const char* call = "_reduce_scatter_base";
  Staging staging(call);
  comm::Tensor out = staging.output(output);
  staging.check(input);
  if (input.numel() != output.numel() * getSize()) {
    throw comm::InvalidArgument(
        where(call) + "the input holds " + std::to_string(input.numel()) +
        " elements; it must hold the output's " +
        std::to_string(output.numel()) + " times the group's size " +
        std::to_string(getSize()));
  }
  at::Tensor flat = input.contiguous().view({-1});
  std::vector<comm::Tensor> views;
  for (int r = 0; r < getSize(); ++r) {
    views.push_back(view_of(
        flat.narrow(0, r * output.numel(), output.numel()).view(output.sizes()),
        call));
  }
  return run(c10d::OpType::_REDUCE_SCATTER_BASE, staging, {output},
             [&](comm::ProcessGroup& group) {
               return group.reduce_scatter(out, views,
                                           {.op = op_of(opts.reduceOp, call),
                                            .timeout = opts.timeout,
                                            .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::alltoall_base(
    at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions& opts) {
  constexpr const char* call = "alltoall_base";
  Staging staging(call);
  comm::Tensor in = staging.input(input);
  comm::Tensor out = staging.output(output);
  return run(c10d::OpType::ALLTOALL_BASE, staging, {output},
             [&](comm::ProcessGroup& group) {
               return group.all_to_all(
                   out, in,
                   {.input_split_sizes = input_split_sizes,
                    .output_split_sizes = output_split_sizes,
                    .timeout = opts.timeout,
                    .async_op = async_op_of(opts)});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  constexpr const char* call = "alltoall";
  if (outputs.size() != std::size_t(getSize()) ||
      inputs.size() != std::size_t(getSize())) {
    throw comm::InvalidArgument(
        where(call) + "takes one input and one output tensor per rank (" +
        std::to_string(getSize()) + "), got " + std::to_string(inputs.size()) +
        " and " + std::to_string(outputs.size()));
  }
  Staging staging(call);
  at::Tensor flat_input = staging.flatten(inputs);
  std::vector<int64_t> input_splits;
  std::vector<int64_t> output_splits;
  int64_t output_numel = 0;
  for (int r = 0; r < getSize(); ++r) {
    input_splits.push_back(inputs[r].numel());
    output_splits.push_back(outputs[r].numel());
    output_numel += outputs[r].numel();
    if (outputs[r].scalar_type() != flat_input.scalar_type()) {
      throw comm::InvalidArgument(where(call) +
                                  "the outputs must have the inputs' dtype");
    }
  }
  at::Tensor flat_output = flat_input.new_empty({output_numel});
  staging.unflatten(outputs, flat_output);
  comm::Tensor in = view_of(flat_input, call);
  comm::Tensor out = view_of(flat_output, call);
  return run(
      c10d::OpType::ALLTOALL, staging, outputs, [&](comm::ProcessGroup& group) {
        return group.all_to_all(out, in,
                                {.input_split_sizes = std::move(input_splits),
                                 .output_split_sizes = std::move(output_splits),
                                 .timeout = opts.timeout,
                                 .async_op = async_op_of(opts)});
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::send(
    std::vector<at::Tensor>& tensors, int dst, int tag) {
  constexpr const char* call = "send";
  Staging staging(call);
  comm::Tensor tensor = staging.input(single(tensors, call));
  return run(c10d::OpType::SEND, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.isend(tensor, dst, {.tag = tag});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::recv(
    std::vector<at::Tensor>& tensors, int src, int tag) {
  constexpr const char* call = "recv";
  Staging staging(call);
  comm::Tensor tensor = staging.output(single(tensors, call));
  return run(c10d::OpType::RECV, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.irecv(tensor, src, {.tag = tag});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  constexpr const char* call = "recvAnysource";
  Staging staging(call);
  comm::Tensor tensor = staging.output(single(tensors, call));
  return run(c10d::OpType::RECVANYSOURCE, staging, tensors,
             [&](comm::ProcessGroup& group) {
               return group.irecv(tensor, comm::kAnySource, {.tag = tag});
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLibcomm::barrier(
    const c10d::BarrierOptions& opts) {
  // On the CPU group, as gloo's: it orders the ranks, not CUDA streams.
  auto work =
      group_->barrier({.timeout = opts.timeout, .async_op = async_op_of(opts)});
  return c10::make_intrusive<WorkLibcomm>(
      getRank(), c10d::OpType::BARRIER, std::move(work),
      std::vector<at::Tensor>(), std::function<void()>(), completion_,
      /*cuda_device=*/-1);
}

void ProcessGroupLibcomm::monitoredBarrier(const c10d::BarrierOptions& opts,
                                           bool /*wait_all_ranks*/) {
  group_->barrier({.timeout = opts.timeout, .async_op = false})->wait();
}

}  // namespace commdist_c10d
