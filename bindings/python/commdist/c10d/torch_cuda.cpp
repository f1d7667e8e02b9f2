#include "torch_cuda.h"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "libcomm/config.h"

// 1 when meson found torch's c10/cuda headers and libc10_cuda, and libcomm
// has the NCCL backend.
#ifndef COMMDIST_C10D_TORCH_CUDA
#define COMMDIST_C10D_TORCH_CUDA 0
#endif
#if COMMDIST_C10D_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace commdist_c10d {
namespace {

c10::Stream torch_current_stream(int device) {
  const c10::Device cuda(c10::DeviceType::CUDA,
                         static_cast<c10::DeviceIndex>(device));
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(cuda);
}

}  // namespace

bool orders_on_torch_streams() { return COMMDIST_C10D_TORCH_CUDA != 0; }

std::string cuda_support() {
#if COMM_WITH_NCCL
  if (orders_on_torch_streams()) {
    return "CUDA tensors go over libcomm's NCCL backend, ordered on torch's "
           "current CUDA stream";
  }
  return "CUDA tensors go over libcomm's NCCL backend; the host waits for "
         "torch's current CUDA stream before each call and for the call in "
         "wait() (torch's CUDA headers or libc10_cuda were not found at build "
         "time)";
#else
  return std::string(
             "CUDA tensors are refused: libcomm was built without its NCCL "
             "backend (") +
         COMM_NCCL_STATUS + ")";
#endif
}

TorchStreamScope::TorchStreamScope(int device) {
#if COMMDIST_C10D_TORCH_CUDA
  guard_.emplace(
      device,
      static_cast<comm::CudaStream>(
          c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))
              .stream()));
#else
  torch_current_stream(device).synchronize();
#endif
}

void record_on_current_stream(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->recordDataPtrOnStream(tensor.storage().data_ptr(),
                              torch_current_stream(tensor.device().index()));
}

}  // namespace commdist_c10d
