#include "libcomm/cuda.h"

#include <string>

#include "libcomm/config.h"
#include "libcomm/detail/cuda_device.h"
#include "libcomm/error.h"

#if COMM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace comm {

namespace {

// Streams are per thread and per device; 64 devices is more than a node has.
constexpr int kMaxDevices = 64;
thread_local CudaStream current_streams[kMaxDevices] = {};

void check_device_index(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw InvalidArgument("CUDA device " + std::to_string(device) +
                          " is outside [0, " + std::to_string(kMaxDevices) +
                          ")");
  }
}

}  // namespace

CudaStream current_cuda_stream(int device) {
  check_device_index(device);
  return current_streams[device];
}

void set_current_cuda_stream(int device, CudaStream stream) {
  check_device_index(device);
  current_streams[device] = stream;
}

CudaStreamGuard::CudaStreamGuard(int device, CudaStream stream)
    : device_(device), previous_(current_cuda_stream(device)) {
  set_current_cuda_stream(device, stream);
}

CudaStreamGuard::~CudaStreamGuard() { current_streams[device_] = previous_; }

#if COMM_WITH_CUDA

namespace {

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw BackendError(what + " failed: " + cudaGetErrorString(status));
  }
}

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

void synchronize_cuda_stream(int device) {
  detail::CudaDeviceGuard guard(device);
  check_cuda(cudaStreamSynchronize(
                 static_cast<cudaStream_t>(current_cuda_stream(device))),
             "cudaStreamSynchronize on cuda:" + std::to_string(device));
}

namespace detail {

CudaDeviceGuard::CudaDeviceGuard(int ordinal) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != ordinal) {
    check_cuda(cudaSetDevice(ordinal),
               "cudaSetDevice(" + std::to_string(ordinal) + ")");
  }
}

CudaDeviceGuard::~CudaDeviceGuard() { cudaSetDevice(previous_); }

void* cuda_malloc(std::size_t nbytes, int ordinal) {
  CudaDeviceGuard guard(ordinal);
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
  throw UnsupportedError(std::string(what) +
                         " needs CUDA, but libcomm was built without it; "
                         "reconfigure with -Dcuda=enabled (and -Dgpu_root "
                         "if CUDA is not under /usr/local/cuda)");
}

}  // namespace

bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }
void synchronize_cuda_stream(int) { no_cuda("synchronizing a CUDA stream"); }

namespace detail {
CudaDeviceGuard::CudaDeviceGuard(int) { no_cuda("selecting a CUDA device"); }
CudaDeviceGuard::~CudaDeviceGuard() = default;
void* cuda_malloc(std::size_t, int) { no_cuda("allocating a CUDA tensor"); }
void cuda_free(void*, int) noexcept {}
void cuda_memcpy(void*, const void*, std::size_t) {
  no_cuda("copying to or from a CUDA tensor");
}
}  // namespace detail

#endif

}  // namespace comm
