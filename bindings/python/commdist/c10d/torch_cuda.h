// How libcomm's torch backend orders its work on CUDA tensors with torch's.
//
// libcomm's NCCL backend issues each operation after the work queued on
// libcomm's current stream of the device (comm::current_cuda_stream), and
// its unbounded comm::Work::wait() makes that stream wait for the
// operation. Where the build found torch's CUDA headers and libc10_cuda (a
// torch built with CUDA), TorchStreamScope makes torch's current stream
// libcomm's current stream, so neither side blocks the host: the stream
// semantics of torch's own ProcessGroupNCCL. Otherwise torch's current
// stream cannot be named to libcomm (c10's device-generic interface does
// not give the cudaStream_t), and the host waits instead: for torch's
// current stream before an operation is issued, and for the operation
// before a wait() returns.
//
// The functions here that reach torch's CUDA runtime use c10's
// device-generic interface, which a torch without CUDA has too; they are
// only called for CUDA tensors, which such a torch never makes.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "libcomm/cuda.h"

namespace commdist_c10d {

// True when this build orders libcomm's CUDA work on torch's current
// streams without blocking the host (see above).
bool orders_on_torch_streams();

// What the backend does with CUDA tensors in this build, in one sentence.
std::string cuda_support();

// For its lifetime, the NCCL operations this thread issues on `device` run
// after the work queued so far on torch's current stream of `device`, and
// an unbounded comm::Work::wait() makes that stream wait for its operation.
// Without orders_on_torch_streams(), the constructor waits on the host for
// torch's current stream instead (and a wait() must block the host).
class TorchStreamScope {
 public:
  explicit TorchStreamScope(int device);
  TorchStreamScope(const TorchStreamScope&) = delete;
  TorchStreamScope& operator=(const TorchStreamScope&) = delete;

 private:
  std::optional<comm::CudaStreamGuard> guard_;
};

// Keeps torch's caching allocator from handing `tensor`'s memory out again
// before the work queued so far on torch's current stream of its device is
// done, as Tensor.record_stream does: for a staging buffer that is read on
// a stream other than the one it was allocated on.
void record_on_current_stream(const at::Tensor& tensor);

}  // namespace commdist_c10d
