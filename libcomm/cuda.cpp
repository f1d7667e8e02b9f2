#include "libcomm/cuda.h"

#include <string>

#include "libcomm/config.h"
#include "libcomm/detail/cuda.h"
#include "libcomm/error.h"

#if COMM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace comm {

#if COMM_WITH_CUDA

namespace {

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw BackendError(what + " failed: " + cudaGetErrorString(status));
  }
}

// Makes `ordinal` current for the lifetime of the guard, restoring the
// caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != ordinal) {
      check_cuda(cudaSetDevice(ordinal),
                 "cudaSetDevice(" + std::to_string(ordinal) + ")");
    }
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

namespace detail {

void* cuda_malloc(std::size_t nbytes, int ordinal) {
  DeviceGuard guard(ordinal);
  void* data = nullptr;
  check_cuda(cudaMalloc(&data, nbytes),
             "cudaMalloc of " + std::to_string(nbytes) +
                 " bytes on cuda:" + std::to_string(ordinal));
  return data;
}

void cuda_free(void* data, int ordinal) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  cudaSetDevice(ordinal);
  cudaFree(data);
  cudaSetDevice(previous);
}

void cuda_memcpy(void* dst, const void* src, std::size_t nbytes) {
  check_cuda(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault),
             "cudaMemcpy of " + std::to_string(nbytes) + " bytes");
}

}  // namespace detail

#else  // !COMM_WITH_CUDA

namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw InvalidArgument(std::string(what) +
                        " needs CUDA, but libcomm was built without it; "
                        "reconfigure with -Dcuda=enabled (and -Dgpu_root "
                        "if CUDA is not under /usr/local/cuda)");
}

}  // namespace

bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }

namespace detail {
void* cuda_malloc(std::size_t, int) { no_cuda("allocating a CUDA tensor"); }
void cuda_free(void*, int) noexcept {}
void cuda_memcpy(void*, const void*, std::size_t) {
  no_cuda("copying to or from a CUDA tensor");
}
}  // namespace detail

#endif

}  // namespace comm
