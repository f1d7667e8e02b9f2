// What the process can see of CUDA, and the calling thread's current
// stream, which collectives on CUDA tensors order themselves after.
#pragma once

#include "libcomm/export.h"

namespace comm {

// True when libcomm was built with CUDA support.
COMM_API bool built_with_cuda();

// The number of CUDA devices this process can use: 0 when libcomm was built
// without CUDA, when there is no driver or no device.
COMM_API int cuda_device_count();

// A cudaStream_t, opaque here so that callers need no CUDA headers. Null is
// the legacy default stream.
using CudaStream = void*;

// The calling thread's current stream on CUDA device `device`, as in
// PyTorch: a collective on a CUDA tensor starts after the work already
// queued on it (the kernels that produced its input), and Work::wait()
// makes it wait for the collective. Null (the legacy default stream) until
// set. Throws InvalidArgument for a negative device.
COMM_API CudaStream current_cuda_stream(int device);
COMM_API void set_current_cuda_stream(int device, CudaStream stream);

// Blocks until the current stream of `device` has finished its work.
// Throws BackendError when CUDA reports an error.
COMM_API void synchronize_cuda_stream(int device);

// Makes `stream` current on `device` for the guard's lifetime.
class COMM_API CudaStreamGuard {
 public:
  CudaStreamGuard(int device, CudaStream stream);
  ~CudaStreamGuard();
  CudaStreamGuard(const CudaStreamGuard&) = delete;
  CudaStreamGuard& operator=(const CudaStreamGuard&) = delete;

 private:
  int device_;
  CudaStream previous_;
};

}  // namespace comm
