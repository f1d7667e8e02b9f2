// DLPack interchange, so that numpy arrays, PyTorch and JAX tensors pass to
// and from libcomm without a copy.
#pragma once

#include "libcomm/export.h"
#include "libcomm/tensor.h"

// From <dlpack/dlpack.h> (libdlpack-dev); only pointers cross this header.
struct DLManagedTensor;

namespace comm {

// The DLPack type code of bool (DLPack >= 0.8 names it kDLBool; the 0.6
// header Debian 12 ships does not, but the value is fixed by the standard).
inline constexpr int kDLPackBoolCode = 6;

// Exports a view of `tensor`. The returned DLManagedTensor keeps the memory
// alive until the consumer calls its deleter, which it must do exactly once.
// Shape and strides are those of the tensor; byte_offset is 0.
COMM_API DLManagedTensor* to_dlpack(const Tensor& tensor);

// Imports a DLPack tensor without copying. On success the returned Tensor
// owns `managed`: its deleter runs exactly once, after the last view of the
// memory is gone. On failure (an unsupported dtype, device or lanes) this
// throws InvalidArgument and `managed` still belongs to the caller.
COMM_API Tensor from_dlpack(DLManagedTensor* managed);

// A view of the memory `managed` describes, for callers that keep the
// producer's tensor alive themselves (the C API borrows tensors this way).
// Nothing is owned: its deleter is never called. Throws InvalidArgument as
// from_dlpack does.
COMM_API Tensor view_dlpack(const DLManagedTensor& managed);

}  // namespace comm
