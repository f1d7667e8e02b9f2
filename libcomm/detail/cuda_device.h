// The thin layer between libcomm's core and the CUDA runtime. In a build
// without CUDA every call that would need a GPU throws InvalidArgument saying
// so, and cuda_device_count() is 0, so callers need no #ifdefs.
#pragma once

#include <cstddef>

namespace comm::detail {

// Allocates on CUDA device `ordinal`. Throws BackendError naming the size and
// device when cudaMalloc fails.
void* cuda_malloc(std::size_t nbytes, int ordinal);
void cuda_free(void* data, int ordinal) noexcept;

// Makes CUDA device `ordinal` current for the guard's lifetime and restores
// the caller's device afterwards. Throws BackendError when CUDA refuses.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int ordinal);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A synchronous copy between any two of host and device memory (unified
// addressing tells the directions apart).
void cuda_memcpy(void* dst, const void* src, std::size_t nbytes);

}  // namespace comm::detail
