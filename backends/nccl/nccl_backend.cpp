#include "backends/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>

#include "backends/nccl/flat_blocks.h"
#include "libcomm/cuda.h"
#include "libcomm/detail/collective_args.h"
#include "libcomm/detail/cuda_device.h"
#include "libcomm/detail/log.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "libcomm/reduce_kernels.h"

namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at pending operations. Completion of a
// waited-on operation is observed at this granularity on the host; the
// device side (stream waits) is not delayed by it.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(1);

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw BackendError(what + " failed: " + cudaGetErrorString(status));
  }
}

std::string nccl_message(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI8: return ncclInt8;
    case DType::kU8: return ncclUint8;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kBool: return ncclUint8;  // one byte holding 0 or 1
  }
  throw UnsupportedError(std::string("dtype ") + dtype_name(dtype) +
                         " has no NCCL type");
}

// NCCL's op for `op` on `dtype`. Bool is a byte of 0 or 1, where or is max
// and and is min. Throws InvalidArgument for what NCCL cannot do.
ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  check_reduce_op(op, dtype);
  const bool logical = dtype == DType::kBool;
  switch (op) {
    case ReduceOp::kSum: return logical ? ncclMax : ncclSum;
    case ReduceOp::kProduct: return logical ? ncclMin : ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: break;
  }
  throw UnsupportedError(std::string("reduce op ") + reduce_op_name(op) +
                         " is bitwise, and NCCL has no bitwise reductions; "
                         "use sum, avg, prod, min or max, or the tcp backend");
}

// What stage() throws when it cannot allocate: nothing of the operation
// has been queued then (stage() comes first in every launch). In a group
// of one rank only the call fails; in a larger one the communicator is
// aborted, since the peers have issued the operation that this rank has
// not, and NCCL pairs operations by their order alone: this rank's next
// one would meet the peers' current one.
class StagingFailed final : public BackendError {
 public:
  using BackendError::BackendError;
};

// A staging buffer and its size.
struct StagedBuffer {
  void* buffer;
  std::size_t bytes;
};

}  // namespace

// The group's communicator and the stream its operations run on.
struct NcclBackend::Communicator {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t input_ready = nullptr;  // recorded on the caller's stream
  std::chrono::milliseconds timeout{0};
  // One byte that barrier all-reduces, zeroed on `stream` before the first.
  void* barrier_token = nullptr;
  // The pool that stage() takes buffers from, or null where the device has
  // no stream-ordered memory pools (stage() then uses cudaMalloc).
  cudaMemPool_t staging = nullptr;
  // The buffers of stage() that the operation being issued still holds:
  // with a pool, those not given back yet, which a failed staging frees; on
  // a device without pools, all of them, which issue() hands to the
  // operation's Pending, to come back to `spare` once it completes.
  std::vector<StagedBuffer> staged_now;
  // Without a pool: cudaMalloc'd buffers no operation uses any more, which
  // stage() reuses, freed with the communicator. Freeing each as its
  // operation completes would take cudaFree, which waits for the whole
  // device: behind a kernel that never ends (a peer that died), the
  // watchdog would wait too instead of aborting it.
  std::vector<StagedBuffer> spare;

  // A device buffer of `bytes` for the operation being issued, valid for
  // the work issued on `stream` until unstage(). From the group's pool, in
  // stream order: nothing synchronizes, and once a size has been staged the
  // pool reuses its memory instead of asking the driver again (the pool
  // keeps what it was given back; it is freed with the communicator).
  // Without a pool, a spare buffer, or cudaMalloc. A launch calls it before
  // it queues anything, so that StagingFailed leaves nothing queued.
  void* stage(std::size_t bytes, const std::string& what) {
    void* buffer = nullptr;
    if (bytes == 0) return buffer;
    if (staging == nullptr) {
      // The smallest spare buffer that holds `bytes`.
      auto best = spare.end();
      for (auto it = spare.begin(); it != spare.end(); ++it) {
        if (it->bytes >= bytes &&
            (best == spare.end() || it->bytes < best->bytes))
          best = it;
      }
      if (best != spare.end()) {
        staged_now.push_back(*best);
        spare.erase(best);
        return staged_now.back().buffer;
      }
    }
    const cudaError_t status =
        staging != nullptr
            ? cudaMallocFromPoolAsync(&buffer, bytes, staging, stream)
            : cudaMalloc(&buffer, bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();  // an allocation's error is not sticky; clear it
      throw StagingFailed(what + " could not stage " + std::to_string(bytes) +
                          " bytes on cuda:" + std::to_string(device) + ": " +
                          cudaGetErrorString(status) +
                          "; free device memory, or pass the list as the "
                          "consecutive blocks of one tensor, which needs "
                          "no staging");
    }
    staged_now.push_back({buffer, bytes});
    return buffer;
  }
  // Gives back a buffer of stage() once the work issued on `stream` so far
  // is done with it.
  void unstage(void* buffer, const std::string& what) {
    if (buffer == nullptr || staging == nullptr) return;
    std::erase_if(staged_now,
                  [&](const StagedBuffer& s) { return s.buffer == buffer; });
    check_cuda(cudaFreeAsync(buffer, stream), "cudaFreeAsync in " + what);
  }
  // After StagingFailed, when nothing of the launch has been queued: gives
  // back what it staged before the allocation that failed.
  void unstage_unused() {
    for (const StagedBuffer& s : staged_now) {
      if (staging != nullptr) {
        cudaFreeAsync(s.buffer, stream);
      } else {
        spare.push_back(s);
      }
    }
    staged_now.clear();
  }
  // After a launch that threw once it may have queued work: what it staged
  // stays allocated until the communicator goes (a pool's memory with the
  // pool), since a kernel NCCL is still queuing may use it; a free in
  // stream order could run ahead of it.
  void abandon_staged() { staged_now.clear(); }

  // Waits until the NCCL call that answered `result` is done, at most the
  // timeout, and throws when it failed. NCCL runs this communicator
  // non-blocking, so that neither set-up nor a call waits without bound: a
  // call may answer ncclInProgress, and the communicator's state says when
  // it is done.
  void wait_for(ncclResult_t result, const std::string& what) {
    // Saturating: the group's timeout may be "forever".
    const auto deadline = detail::deadline_after(timeout);
    while (result == ncclInProgress) {
      if (Clock::now() >= deadline) {
        throw TimeoutError(what + " did not complete within " +
                           format_duration(timeout));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
    }
    if (result != ncclSuccess) {
      throw BackendError(what + " failed: " + nccl_message(result, comm));
    }
  }
};

namespace {

// The completion event of one operation, shared by its Work (for stream
// waits) and the watchdog (which destroys it once the operation is over).
struct CompletionEvent {
  std::mutex mutex;
  cudaEvent_t event = nullptr;
  int device = 0;

  void destroy() {
    std::lock_guard<std::mutex> lock(mutex);
    if (event != nullptr) {
      detail::CudaDeviceGuard guard(device);
      cudaEventDestroy(event);
      event = nullptr;
    }
  }

  // cudaSuccess once the operation has run, cudaErrorNotReady before, or
  // the error CUDA reports. Never throws: the watchdog and shutdown (a
  // destructor) ask, and an error here makes them abort.
  cudaError_t query() {
    std::lock_guard<std::mutex> lock(mutex);
    try {
      detail::CudaDeviceGuard guard(device);
      return cudaEventQuery(event);
    } catch (const Error&) {
      return cudaErrorInvalidDevice;
    }
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::string description, std::shared_ptr<CompletionEvent> done,
           bool blocks_host)
      : Work(std::move(description)),
        done_(std::move(done)),
        blocks_host_(blocks_host) {}

  bool wait(Duration timeout) override {
    if (timeout != kNoTimeout || blocks_host_) return Work::wait(timeout);
    if (auto error = exception()) std::rethrow_exception(error);
    // Order the caller's stream after the operation; the host goes on. The
    // event is destroyed once the operation is over: after it succeeded, or
    // after an abort has failed the Work, so a Work without an event here
    // has its outcome.
    std::lock_guard<std::mutex> lock(done_->mutex);
    if (done_->event == nullptr) {
      if (auto error = exception()) std::rethrow_exception(error);
    } else {
      detail::CudaDeviceGuard guard(done_->device);
      check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(
                                         current_cuda_stream(done_->device)),
                                     done_->event, 0),
                 "cudaStreamWaitEvent for " + description());
    }
    return true;
  }

 private:
  std::shared_ptr<CompletionEvent> done_;
  bool blocks_host_;
};

}  // namespace

struct NcclBackend::Pending {
  std::shared_ptr<NcclWork> work;
  std::shared_ptr<CompletionEvent> done;
  std::vector<Tensor> keep;  // alive until the operation completes
  // cudaMalloc'd staging (devices without pools), spare once it completes.
  std::vector<StagedBuffer> staged;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout;

  // Once their operations have run: destroys each one's event and finishes
  // its Work, waking its waiters, then drops them. Called without the
  // backend's lock. Returns their staging, for the caller to make spare
  // under the lock, and moves the tensors they kept to `kept`, for the
  // releaser to drop where it may block (see released_).
  static std::vector<StagedBuffer> complete(
      std::vector<std::shared_ptr<Pending>>& finished,
      std::vector<std::vector<Tensor>>& kept) {
    std::vector<StagedBuffer> staging;
    for (auto& p : finished) {
      p->done->destroy();
      p->work->finish();
      staging.insert(staging.end(), p->staged.begin(), p->staged.end());
      kept.push_back(std::move(p->keep));
    }
    finished.clear();
    return staging;
  }
};

NcclBackend::NcclBackend(std::shared_ptr<Store> store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : Backend(rank, size), store_(std::move(store)), timeout_(timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("NcclBackend: rank " + std::to_string(rank) +
                          " is outside [0, " + std::to_string(size) + ")");
  }
  releaser_ = std::thread([this] { release(); });
  try {
    watchdog_ = std::thread([this] { watch(); });
  } catch (...) {
    stop_releaser();
    throw;
  }
}

NcclBackend::~NcclBackend() { shutdown(); }

int NcclBackend::device() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_.value_or(-1);
}

void NcclBackend::check_open_locked() const {
  if (stopping_) {
    throw BackendError("the process group was shut down; create a new one");
  }
  if (!aborted_.empty()) {
    throw BackendError("the group's NCCL communicator was aborted (" +
                       aborted_ + "); create a new group");
  }
}

int NcclBackend::device_for(const Tensor& tensor, const std::string& op) {
  if (!tensor.device().is_cuda()) {
    throw InvalidArgument(op +
                          ": the nccl backend works on CUDA tensors, "
                          "and " +
                          tensor.describe() +
                          " is in host memory; use the tcp backend, or a "
                          "group made with \"cpu:tcp,cuda:nccl\"");
  }
  const int device = tensor.device().index;
  std::lock_guard<std::mutex> lock(mutex_);
  if (device_ && *device_ != device) {
    throw InvalidArgument(
        op + ": " + tensor.describe() +
        " is on cuda:" + std::to_string(device) +
        ", but this group runs on cuda:" + std::to_string(*device_) +
        "; move the tensor there or make a group per device");
  }
  return device;
}

std::string NcclBackend::describe(const char* op, const Tensor& tensor,
                                  const std::string& extra) const {
  return std::string(op) + " (" + dtype_name(tensor.dtype()) + " x " +
         std::to_string(tensor.numel()) + (extra.empty() ? "" : ", " + extra) +
         ")";
}

NcclBackend::Communicator& NcclBackend::communicator(int device) {
  // With mutex_ held: every rank creates its communicator at its first
  // operation, which is the same operation everywhere.
  if (communicator_) return *communicator_;
  detail::CudaDeviceGuard guard(device);
  auto c = std::make_unique<Communicator>();
  c->device = device;
  c->timeout = timeout_;
  ncclUniqueId id;
  const std::string key = "nccl/unique_id";
  if (rank() == 0) {
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw BackendError("ncclGetUniqueId failed: " +
                         nccl_message(result, nullptr));
    }
    Bytes bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    store_->set(key, bytes);
  } else {
    const Bytes bytes = store_->get(key, timeout_);
    if (bytes.size() != sizeof(id)) {
      throw BackendError("the NCCL unique id in the store has " +
                         std::to_string(bytes.size()) + " bytes, not " +
                         std::to_string(sizeof(id)) +
                         "; do all ranks run the same NCCL?");
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string what =
      "creating the NCCL communicator of rank " + std::to_string(rank()) +
      " of " + std::to_string(size()) + " on cuda:" + std::to_string(device);
  ncclResult_t result =
      ncclCommInitRankConfig(&c->comm, size(), id, rank(), &config);
  try {
    c->wait_for(result, what);
  } catch (const TimeoutError& e) {
    if (c->comm != nullptr) ncclCommAbort(c->comm);
    throw TimeoutError(std::string(e.what()) +
                       "; a rank that never joins holds every other rank "
                       "here (is every rank using a GPU of its own? NCCL "
                       "refuses two ranks on one GPU)");
  } catch (...) {
    if (c->comm != nullptr) ncclCommAbort(c->comm);
    throw;
  }
  check_cuda(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags on cuda:" + std::to_string(device));
  check_cuda(cudaEventCreateWithFlags(&c->input_ready, cudaEventDisableTiming),
             "cudaEventCreateWithFlags");
  check_cuda(cudaMalloc(&c->barrier_token, 1), "cudaMalloc (barrier token)");
  check_cuda(cudaMemsetAsync(c->barrier_token, 0, 1, c->stream),
             "cudaMemsetAsync (barrier token)");
  int pools = 0;
  cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
  if (pools != 0) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check_cuda(cudaMemPoolCreate(&c->staging, &props),
               "cudaMemPoolCreate on cuda:" + std::to_string(device));
    // Keep given-back memory for the next operation: without this the pool
    // returns it to the driver at every synchronization.
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check_cuda(cudaMemPoolSetAttribute(c->staging,
                                       cudaMemPoolAttrReleaseThreshold, &keep),
               "cudaMemPoolSetAttribute");
  }
  COMM_LOG_INFO("nccl: rank {} of {} created its communicator on cuda:{}",
                rank(), size(), device);
  device_ = device;
  communicator_ = std::move(c);
  return *communicator_;
}

std::shared_ptr<Work> NcclBackend::issue(std::string description,
                                         std::vector<Tensor> keep, int device,
                                         OpTimeout timeout, Launch launch,
                                         bool blocks_host) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open_locked();
  const std::uint64_t sequence = next_sequence_++;
  // "all_reduce #12 (float32 x 1024, sum) on rank 3"
  const auto space = description.find(' ');
  description.insert(space == std::string::npos ? description.size() : space,
                     " #" + std::to_string(sequence));
  description += " on rank " + std::to_string(rank());

  Communicator& c = communicator(device);
  detail::CudaDeviceGuard guard(device);
  auto caller = static_cast<cudaStream_t>(current_cuda_stream(device));
  // The input is ready when the caller's stream gets here.
  check_cuda(cudaEventRecord(c.input_ready, caller),
             "cudaEventRecord before " + description);
  check_cuda(cudaStreamWaitEvent(c.stream, c.input_ready, 0),
             "cudaStreamWaitEvent before " + description);
  const std::chrono::milliseconds op_timeout =
      timeout == kDefaultTimeout ? timeout_ : timeout;
  // A call NCCL answers ncclInProgress (its first to a peer, while the
  // connection is made) is waited for here, under the lock: at most this
  // operation's own timeout.
  struct RestoreTimeout {
    Communicator& c;
    std::chrono::milliseconds kept;
    ~RestoreTimeout() { c.timeout = kept; }
  } restore{c, c.timeout};
  c.timeout = op_timeout;
  // Counted from before the launch, which may itself wait.
  const auto deadline = detail::deadline_after(op_timeout);
  try {
    launch(c);
  } catch (const StagingFailed& e) {
    c.unstage_unused();
    if (size() > 1) {
      abort_locked(description + " could not be issued: " + e.what(), false);
    }
    throw;
  } catch (const Error& e) {
    // A call NCCL refused may have left the communicator in any state.
    c.abandon_staged();
    abort_locked(description + " could not be issued: " + e.what(), false);
    throw;
  }
  auto done = std::make_shared<CompletionEvent>();
  done->device = device;
  check_cuda(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming),
             "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(done->event, c.stream),
             "cudaEventRecord after " + description);

  auto pending = std::make_shared<Pending>();
  pending->work = std::make_shared<NcclWork>(description, done, blocks_host);
  pending->done = done;
  pending->keep = std::move(keep);
  pending->staged = std::move(c.staged_now);  // empty where there is a pool
  c.staged_now.clear();
  pending->timeout = op_timeout;
  pending->deadline = deadline;
  pending_.push_back(pending);
  watchdog_wake_.notify_one();
  return pending->work;
}

void NcclBackend::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Runs until shutdown; sleeps while nothing is pending, and between looks
  // otherwise.
  while (!stopping_) {
    if (pending_.empty()) {
      watchdog_wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      continue;
    }
    watchdog_wake_.wait_for(lock, kWatchdogPeriod);
    if (stopping_ || !communicator_ || communicator_->comm == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(communicator_->comm, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress) {
      abort_locked(
          "NCCL reported an error: " + nccl_message(async, communicator_->comm),
          false);
      continue;
    }
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Pending>> finished;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const cudaError_t state = (*it)->done->query();
      if (state == cudaSuccess) {
        finished.push_back(*it);
        it = pending_.erase(it);
        continue;
      }
      if (state != cudaErrorNotReady) {
        abort_locked(
            std::string("CUDA reported an error: ") + cudaGetErrorString(state),
            false);
        break;
      }
      if (now >= (*it)->deadline) {
        abort_locked((*it)->work->description() + " did not complete within " +
                         format_duration((*it)->timeout),
                     true);
        break;
      }
      ++it;
    }
    lock.unlock();
    std::vector<std::vector<Tensor>> kept;
    const std::vector<StagedBuffer> spare = Pending::complete(finished, kept);
    lock.lock();
    std::move(kept.begin(), kept.end(), std::back_inserter(released_));
    releaser_wake_.notify_one();
    if (communicator_) {
      communicator_->spare.insert(communicator_->spare.end(), spare.begin(),
                                  spare.end());
    }
  }
}

void NcclBackend::abort_locked(const std::string& reason, bool timed_out) {
  if (!aborted_.empty() || !communicator_) return;
  aborted_ = reason;
  COMM_LOG_ERROR("nccl: aborting the communicator of rank {}: {}", rank(),
                 reason);
  ncclCommAbort(communicator_->comm);
  communicator_->comm = nullptr;
  for (auto& p : pending_) {
    const std::string message =
        p->work->description() +
        " failed: the NCCL communicator was aborted: " + reason;
    // Its staging, if cudaMalloc'd, is left allocated: the stream may still
    // be using it, and cudaFree would wait for it. Its tensors go to the
    // releaser (released_).
    p->work->finish(timed_out ? std::make_exception_ptr(TimeoutError(message))
                              : std::make_exception_ptr(BackendError(message)));
    p->done->destroy();
    released_.push_back(std::move(p->keep));
  }
  pending_.clear();
  releaser_wake_.notify_one();
}

void NcclBackend::release() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Runs until stop_releaser() and nothing is left; sleeps in between.
  while (true) {
    releaser_wake_.wait(
        lock, [&] { return releaser_stopping_ || !released_.empty(); });
    if (released_.empty()) return;
    std::vector<std::vector<Tensor>> kept;
    kept.swap(released_);
    lock.unlock();
    // May wait in cudaFree until the device is idle.
    kept.clear();
    lock.lock();
  }
}

void NcclBackend::stop_releaser() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    releaser_stopping_ = true;
  }
  releaser_wake_.notify_all();
  if (releaser_.joinable()) releaser_.join();
}

void NcclBackend::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_locked(reason, false);
}

void NcclBackend::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  watchdog_wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // Operations the GPU has run that the watchdog had not looked at yet (it
  // looks every kWatchdogPeriod) are not in flight: a group shut down right
  // after its caller synchronized must finalize, not abort. They are
  // finished outside the lock, as the watchdog finishes them.
  std::vector<std::shared_ptr<Pending>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(pending_, [&](const std::shared_ptr<Pending>& p) {
      if (p->done->query() != cudaSuccess) return false;
      finished.push_back(p);
      return true;
    });
  }
  std::vector<std::vector<Tensor>> kept;
  const std::vector<StagedBuffer> spare = Pending::complete(finished, kept);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::move(kept.begin(), kept.end(), std::back_inserter(released_));
    if (communicator_) {
      communicator_->spare.insert(communicator_->spare.end(), spare.begin(),
                                  spare.end());
    }
    close_communicator_locked();
  }
  // Last: the releaser drops what the operations kept, the aborted ones'
  // included, once no operation of this group can hold up a cudaFree.
  stop_releaser();
}

void NcclBackend::close_communicator_locked() {
  if (!communicator_) return;
  Communicator& c = *communicator_;
  if (!pending_.empty()) {
    // Waiting for work in flight could take forever; abort instead.
    abort_locked("the process group was shut down with operations pending",
                 false);
  } else if (c.comm != nullptr) {
    detail::CudaDeviceGuard guard(c.device);
    try {
      c.wait_for(ncclCommFinalize(c.comm), "finalizing the NCCL communicator");
      ncclCommDestroy(c.comm);
    } catch (const Error& e) {
      COMM_LOG_WARN("nccl: {}; aborting instead", e.what());
      ncclCommAbort(c.comm);
    }
    c.comm = nullptr;
  }
  detail::CudaDeviceGuard guard(c.device);
  if (c.input_ready != nullptr) cudaEventDestroy(c.input_ready);
  if (c.stream != nullptr) cudaStreamDestroy(c.stream);
  // Staged buffers have been given back in stream order, except those of
  // an operation whose launch failed or that was aborted; the pool's
  // memory is released once the frees have run and, for those, when the
  // process ends.
  if (c.staging != nullptr) cudaMemPoolDestroy(c.staging);
  // No operation of the communicator runs any more (finalized or aborted).
  for (const StagedBuffer& s : c.spare) cudaFree(s.buffer);
  if (c.barrier_token != nullptr) cudaFree(c.barrier_token);
  communicator_.reset();
}

// The operations, called with arguments Backend has checked. Each checks
// what only NCCL needs (devices, ops), then issues NCCL calls on the group's
// stream; `c.wait_for` turns NCCL's answer into an exception.

std::shared_ptr<Work> NcclBackend::do_broadcast(
    Tensor& tensor, const BroadcastOptions& options) {
  const int device = device_for(tensor, "broadcast");
  const std::string what =
      describe("broadcast", tensor, "root " + std::to_string(options.root));
  return issue(what, {tensor}, device, options.timeout,
               [tensor, options, what](Communicator& c) {
                 c.wait_for(
                     ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(),
                                   static_cast<std::size_t>(tensor.numel()),
                                   nccl_type(tensor.dtype()), options.root,
                                   c.comm, c.stream),
                     what);
               });
}

std::shared_ptr<Work> NcclBackend::do_reduce(Tensor& tensor,
                                             const ReduceOptions& options) {
  const ncclRedOp_t op = nccl_op(options.op, tensor.dtype());
  const int device = device_for(tensor, "reduce");
  const std::string what =
      describe("reduce", tensor,
               std::string(reduce_op_name(options.op)) + ", root " +
                   std::to_string(options.root));
  return issue(what, {tensor}, device, options.timeout,
               [tensor, options, op, what](Communicator& c) {
                 c.wait_for(ncclReduce(tensor.data_ptr(), tensor.data_ptr(),
                                       static_cast<std::size_t>(tensor.numel()),
                                       nccl_type(tensor.dtype()), op,
                                       options.root, c.comm, c.stream),
                            what);
               });
}

std::shared_ptr<Work> NcclBackend::do_all_reduce(
    Tensor& tensor, const AllReduceOptions& options) {
  return start_all_reduce("all_reduce", tensor, tensor, options);
}

std::shared_ptr<Work> NcclBackend::do_all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  return start_all_reduce("all_reduce_into", output, input, options);
}

std::shared_ptr<Work> NcclBackend::start_all_reduce(
    const char* op_name, Tensor& output, const Tensor& input,
    const AllReduceOptions& options) {
  const ncclRedOp_t op = nccl_op(options.op, input.dtype());
  // The output is on the input's device (check_out_of_place).
  const int device = device_for(input, op_name);
  const std::string what =
      describe("all_reduce", input, reduce_op_name(options.op));
  return issue(what, {output, input}, device, options.timeout,
               [output, input, op, what](Communicator& c) {
                 c.wait_for(ncclAllReduce(
                                input.data_ptr(), output.data_ptr(),
                                static_cast<std::size_t>(input.numel()),
                                nccl_type(input.dtype()), op, c.comm, c.stream),
                            what);
               });
}

std::shared_ptr<Work> NcclBackend::do_all_gather_into(
    Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  const int device = device_for(input, "all_gather_into");
  device_for(output, "all_gather_into");
  const std::string what = describe("all_gather", input, "");
  return issue(what, {output, input}, device, options.timeout,
               [output, input, what](Communicator& c) {
                 c.wait_for(
                     ncclAllGather(input.data_ptr(), output.data_ptr(),
                                   static_cast<std::size_t>(input.numel()),
                                   nccl_type(input.dtype()), c.comm, c.stream),
                     what);
               });
}

std::shared_ptr<Work> NcclBackend::do_all_gather(
    std::vector<Tensor>& outputs, const Tensor& input,
    const AllGatherOptions& options) {
  const int device = device_for(input, "all_gather");
  for (const Tensor& out : outputs) device_for(out, "all_gather");
  // NCCL gathers into one flat buffer: the outputs themselves when they are
  // the consecutive blocks of one, else a staging buffer copied out on the
  // stream.
  auto* direct = static_cast<std::uint8_t*>(
      nccl::flat_blocks(outputs, input.data_ptr(), rank()));
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  const std::string what = describe("all_gather", input, "");
  return issue(
      what, keep, device, options.timeout,
      [outputs, input, direct, what](Communicator& c) {
        const std::size_t bytes = input.nbytes();
        auto* flat = direct != nullptr ? direct
                                       : static_cast<std::uint8_t*>(c.stage(
                                             bytes * outputs.size(), what));
        c.wait_for(ncclAllGather(input.data_ptr(), flat,
                                 static_cast<std::size_t>(input.numel()),
                                 nccl_type(input.dtype()), c.comm, c.stream),
                   what);
        if (direct != nullptr) return;
        for (std::size_t r = 0; r < outputs.size(); ++r) {
          check_cuda(cudaMemcpyAsync(outputs[r].data_ptr(), flat + r * bytes,
                                     bytes, cudaMemcpyDeviceToDevice, c.stream),
                     "cudaMemcpyAsync in " + what);
        }
        c.unstage(flat, what);
      });
}

std::shared_ptr<Work> NcclBackend::do_reduce_scatter(
    Tensor& output, const std::vector<Tensor>& inputs,
    const ReduceScatterOptions& options) {
  const ncclRedOp_t op = nccl_op(options.op, output.dtype());
  const int device = device_for(output, "reduce_scatter");
  for (const Tensor& in : inputs) device_for(in, "reduce_scatter");
  // NCCL reads one flat buffer of every rank's block: the inputs themselves
  // when they are the consecutive blocks of one, else a staging buffer they
  // are copied into on the stream (which also makes any overlap with the
  // output safe).
  auto* direct = static_cast<std::uint8_t*>(
      nccl::flat_blocks(inputs, output.data_ptr(), rank()));
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  const std::string what =
      describe("reduce_scatter", output, reduce_op_name(options.op));
  return issue(
      what, keep, device, options.timeout,
      [output, inputs, direct, op, what](Communicator& c) {
        const std::size_t bytes = output.nbytes();
        auto* flat = direct;
        if (flat == nullptr) {
          flat =
              static_cast<std::uint8_t*>(c.stage(bytes * inputs.size(), what));
          for (std::size_t r = 0; r < inputs.size(); ++r) {
            check_cuda(
                cudaMemcpyAsync(flat + r * bytes, inputs[r].data_ptr(), bytes,
                                cudaMemcpyDeviceToDevice, c.stream),
                "cudaMemcpyAsync in " + what);
          }
        }
        c.wait_for(
            ncclReduceScatter(flat, output.data_ptr(),
                              static_cast<std::size_t>(output.numel()),
                              nccl_type(output.dtype()), op, c.comm, c.stream),
            what);
        if (direct == nullptr) c.unstage(flat, what);
      });
}

std::shared_ptr<Work> NcclBackend::do_gather(std::vector<Tensor>& outputs,
                                             const Tensor& input,
                                             const GatherOptions& options) {
  const int device = device_for(input, "gather");
  for (const Tensor& out : outputs) device_for(out, "gather");
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  const std::string what =
      describe("gather", input, "root " + std::to_string(options.root));
  const int me = rank();
  const int n = size();
  return issue(
      what, keep, device, options.timeout,
      [outputs, input, options, me, n, what](Communicator& c) {
        const auto count = static_cast<std::size_t>(input.numel());
        const ncclDataType_t type = nccl_type(input.dtype());
        ncclGroupStart();
        if (me == options.root) {
          for (int r = 0; r < n; ++r) {
            if (r == me) continue;
            ncclRecv(outputs[r].data_ptr(), count, type, r, c.comm, c.stream);
          }
        } else {
          ncclSend(input.data_ptr(), count, type, options.root, c.comm,
                   c.stream);
        }
        c.wait_for(ncclGroupEnd(), what);
        if (me == options.root && outputs[me].data_ptr() != input.data_ptr()) {
          check_cuda(cudaMemcpyAsync(outputs[me].data_ptr(), input.data_ptr(),
                                     input.nbytes(), cudaMemcpyDeviceToDevice,
                                     c.stream),
                     "cudaMemcpyAsync in " + what);
        }
      });
}

std::shared_ptr<Work> NcclBackend::do_scatter(Tensor& output,
                                              const std::vector<Tensor>& inputs,
                                              const ScatterOptions& options) {
  const int device = device_for(output, "scatter");
  for (const Tensor& in : inputs) device_for(in, "scatter");
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  const std::string what =
      describe("scatter", output, "root " + std::to_string(options.root));
  const int me = rank();
  const int n = size();
  return issue(
      what, keep, device, options.timeout,
      [output, inputs, options, me, n, what](Communicator& c) {
        const auto count = static_cast<std::size_t>(output.numel());
        const ncclDataType_t type = nccl_type(output.dtype());
        ncclGroupStart();
        if (me == options.root) {
          for (int r = 0; r < n; ++r) {
            if (r == me) continue;
            ncclSend(inputs[r].data_ptr(), count, type, r, c.comm, c.stream);
          }
        } else {
          ncclRecv(output.data_ptr(), count, type, options.root, c.comm,
                   c.stream);
        }
        c.wait_for(ncclGroupEnd(), what);
        if (me == options.root && inputs[me].data_ptr() != output.data_ptr()) {
          check_cuda(cudaMemcpyAsync(output.data_ptr(), inputs[me].data_ptr(),
                                     output.nbytes(), cudaMemcpyDeviceToDevice,
                                     c.stream),
                     "cudaMemcpyAsync in " + what);
        }
      });
}

std::shared_ptr<Work> NcclBackend::do_all_to_all(
    Tensor& output, const Tensor& input, const AllToAllOptions& options) {
  // Checked by Backend::all_to_all.
  const detail::AllToAllLayout layout =
      detail::all_to_all_layout(output, input, options.input_split_sizes,
                                options.output_split_sizes, size());
  const int device = device_for(input, "all_to_all");
  device_for(output, "all_to_all");
  const auto n = static_cast<std::size_t>(size());
  const auto self = static_cast<std::size_t>(rank());
  const std::size_t to_self = layout.send_counts()[self];
  const std::size_t from_self = layout.receive_counts()[self];
  if (to_self != from_self) {
    throw InvalidArgument("all_to_all: this rank sends itself " +
                          std::to_string(to_self) + " elements but expects " +
                          std::to_string(from_self) +
                          " from itself; check the split sizes");
  }
  // In place, a block received early would overwrite one not yet sent:
  // send from a staged copy, made on the stream.
  const bool in_place = input.data_ptr() == output.data_ptr();
  const std::string what = describe("all_to_all", input, "");
  const int me = rank();
  return issue(
      what, {output, input}, device, options.timeout, [=](Communicator& c) {
        void* source = input.data_ptr();
        if (in_place) {
          source = c.stage(input.nbytes(), what);
          check_cuda(cudaMemcpyAsync(source, input.data_ptr(), input.nbytes(),
                                     cudaMemcpyDeviceToDevice, c.stream),
                     "cudaMemcpyAsync in " + what);
        }
        const ncclDataType_t type = nccl_type(input.dtype());
        const std::size_t element = input.element_size();
        auto* in = static_cast<std::uint8_t*>(source);
        auto* out = static_cast<std::uint8_t*>(output.data_ptr());
        // From the copy of the layout this task holds.
        const auto send_offsets = layout.send_offsets();
        const auto send_counts = layout.send_counts();
        const auto recv_offsets = layout.receive_offsets();
        const auto recv_counts = layout.receive_counts();
        ncclGroupStart();
        for (std::size_t p = 0; p < n; ++p) {
          if (static_cast<int>(p) == me) continue;
          ncclSend(in + send_offsets[p] * element, send_counts[p], type,
                   static_cast<int>(p), c.comm, c.stream);
          ncclRecv(out + recv_offsets[p] * element, recv_counts[p], type,
                   static_cast<int>(p), c.comm, c.stream);
        }
        c.wait_for(ncclGroupEnd(), what);
        check_cuda(cudaMemcpyAsync(out + recv_offsets[self] * element,
                                   in + send_offsets[self] * element,
                                   send_counts[self] * element,
                                   cudaMemcpyDeviceToDevice, c.stream),
                   "cudaMemcpyAsync in " + what);
        if (in_place) c.unstage(source, what);
      });
}

std::shared_ptr<Work> NcclBackend::do_barrier(const BarrierOptions& options) {
  int device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device_) {
      device = *device_;
    } else {
      // No tensor has named a device yet: cuda:LOCAL_RANK, as torchrun
      // and commrun set it, or the rank.
      const int count = cuda_device_count();
      if (count == 0) {
        throw InvalidArgument(
            "barrier: the nccl backend needs a CUDA device, and this "
            "process sees none (check CUDA_VISIBLE_DEVICES and the driver)");
      }
      const char* local = std::getenv("LOCAL_RANK");
      device = (local ? std::atoi(local) : rank()) % count;
    }
  }
  // An all_reduce of one element: it completes on every rank only once
  // every rank has reached it.
  const std::string what = "barrier";
  return issue(
      what, {}, device, options.timeout,
      [what](Communicator& c) {
        c.wait_for(ncclAllReduce(c.barrier_token, c.barrier_token, 1, ncclUint8,
                                 ncclSum, c.comm, c.stream),
                   what);
      },
      /*blocks_host=*/true);
}

std::shared_ptr<Work> NcclBackend::do_send(const Tensor& tensor, int dst,
                                           const SendOptions& options) {
  const int device = device_for(tensor, "send");
  const std::string what =
      describe("send", tensor, "to rank " + std::to_string(dst));
  return issue(what, {tensor}, device, options.timeout,
               [tensor, dst, what](Communicator& c) {
                 c.wait_for(
                     ncclSend(tensor.data_ptr(),
                              static_cast<std::size_t>(tensor.numel()),
                              nccl_type(tensor.dtype()), dst, c.comm, c.stream),
                     what);
               });
}

std::shared_ptr<Work> NcclBackend::do_recv(Tensor& tensor, int src,
                                           const RecvOptions& options) {
  if (src == kAnySource) {
    throw InvalidArgument(
        "recv: NCCL cannot receive from any source; name the sending rank, "
        "or use the tcp backend");
  }
  const int device = device_for(tensor, "recv");
  const std::string what =
      describe("recv", tensor, "from rank " + std::to_string(src));
  return issue(what, {tensor}, device, options.timeout,
               [tensor, src, what](Communicator& c) {
                 c.wait_for(
                     ncclRecv(tensor.data_ptr(),
                              static_cast<std::size_t>(tensor.numel()),
                              nccl_type(tensor.dtype()), src, c.comm, c.stream),
                     what);
               });
}

}  // namespace comm
