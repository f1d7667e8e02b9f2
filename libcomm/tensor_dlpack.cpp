#include "libcomm/tensor_dlpack.h"

#include <dlpack/dlpack.h>

#include <string>
#include <utility>
#include <vector>

#include "libcomm/error.h"

namespace comm {
namespace {

// Everything an exported DLManagedTensor points into. The embedded Tensor
// holds a reference to the storage, so the memory outlives the consumer's
// use of it.
struct ExportContext {
  Tensor tensor;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

DLDataType to_dl_dtype(DType dtype) {
  DLDataType dl{};
  dl.lanes = 1;
  dl.bits = static_cast<std::uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::kF16:
    case DType::kF32:
    case DType::kF64: dl.code = kDLFloat; break;
    case DType::kBF16: dl.code = kDLBfloat; break;
    case DType::kI8:
    case DType::kI32:
    case DType::kI64: dl.code = kDLInt; break;
    case DType::kU8: dl.code = kDLUInt; break;
    case DType::kBool: dl.code = kDLPackBoolCode; break;
  }
  return dl;
}

DType from_dl_dtype(DLDataType dl) {
  const std::string seen = "code " + std::to_string(dl.code) + ", " +
                           std::to_string(dl.bits) + " bits, " +
                           std::to_string(dl.lanes) + " lanes";
  if (dl.lanes != 1) {
    throw InvalidArgument("from_dlpack: vector dtypes (" + seen +
                          ") are not supported");
  }
  switch (dl.code) {
    case kDLFloat:
      if (dl.bits == 16) return DType::kF16;
      if (dl.bits == 32) return DType::kF32;
      if (dl.bits == 64) return DType::kF64;
      break;
    case kDLBfloat:
      if (dl.bits == 16) return DType::kBF16;
      break;
    case kDLInt:
      if (dl.bits == 8) return DType::kI8;
      if (dl.bits == 32) return DType::kI32;
      if (dl.bits == 64) return DType::kI64;
      break;
    case kDLUInt:
      if (dl.bits == 8) return DType::kU8;
      break;
    case kDLPackBoolCode:
      if (dl.bits == 8) return DType::kBool;
      break;
    default: break;
  }
  // The name torch and numpy give it, where DLPack's code has one.
  const char* kind = dl.code == kDLInt       ? "int"
                     : dl.code == kDLUInt    ? "uint"
                     : dl.code == kDLFloat   ? "float"
                     : dl.code == kDLBfloat  ? "bfloat"
                     : dl.code == kDLComplex ? "complex"
                                             : nullptr;
  throw InvalidArgument(
      "from_dlpack: " +
      (kind != nullptr ? "a tensor of " + std::string(kind) +
                             std::to_string(dl.bits) + " (DLPack " + seen + ")"
                       : "DLPack dtype (" + seen + ")") +
      " has no libcomm dtype; supported are float16/32/64, bfloat16, "
      "int8/32/64, uint8 and bool");
}

Device from_dl_device(DLDevice dl) {
  switch (dl.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory is ordinary host memory to us
      return Device::cpu();
    case kDLCUDA: return Device::cuda(dl.device_id);
    default:
      throw InvalidArgument("from_dlpack: DLPack device type " +
                            std::to_string(dl.device_type) +
                            " is not supported; libcomm takes CPU and CUDA "
                            "memory");
  }
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& tensor) {
  if (!tensor.defined()) {
    throw InvalidArgument("to_dlpack: the tensor is undefined");
  }
  auto* context =
      new ExportContext{tensor, tensor.shape(), tensor.strides(), {}};
  DLTensor& dl = context->managed.dl_tensor;
  dl.data = tensor.data_ptr();
  dl.device.device_type = tensor.device().is_cuda() ? kDLCUDA : kDLCPU;
  dl.device.device_id = tensor.device().is_cuda() ? tensor.device().index : 0;
  dl.ndim = static_cast<int>(tensor.dim());
  dl.dtype = to_dl_dtype(tensor.dtype());
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  dl.byte_offset = 0;
  context->managed.manager_ctx = context;
  context->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &context->managed;
}

namespace {

Tensor import_dlpack(const DLTensor& dl, Storage::Deleter deleter) {
  const DType dtype = from_dl_dtype(dl.dtype);
  const Device device = from_dl_device(dl.device);
  if (dl.ndim < 0 || (dl.ndim > 0 && dl.shape == nullptr)) {
    throw InvalidArgument("from_dlpack: ndim " + std::to_string(dl.ndim) +
                          " with no shape array");
  }
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Strides strides = dl.strides == nullptr
                        ? contiguous_strides(shape)
                        : Strides(dl.strides, dl.strides + dl.ndim);
  for (int d = 0; d < dl.ndim; ++d) {
    if (shape[d] < 0 || strides[d] < 0) {
      throw InvalidArgument("from_dlpack: shape " + shape_string(shape) +
                            " with strides " + shape_string(strides) +
                            " has negative entries, which are not supported");
    }
  }
  void* data = static_cast<std::byte*>(dl.data) + dl.byte_offset;
  // Everything from_blob could reject was checked above, so the deleter is
  // the tensor's from here on.
  return Tensor::from_blob(data, shape, strides, dtype, device,
                           std::move(deleter));
}

}  // namespace

Tensor from_dlpack(DLManagedTensor* managed) {
  if (managed == nullptr) {
    throw InvalidArgument("from_dlpack: the DLManagedTensor is null");
  }
  return import_dlpack(managed->dl_tensor, [managed](void*) {
    if (managed->deleter != nullptr) managed->deleter(managed);
  });
}

Tensor view_dlpack(const DLManagedTensor& managed) {
  return import_dlpack(managed.dl_tensor, {});
}

}  // namespace comm
