// What the process can see of CUDA.
#pragma once

#include "libcomm/export.h"

namespace comm {

// True when libcomm was built with CUDA support.
COMM_API bool built_with_cuda();

// The number of CUDA devices this process can use: 0 when libcomm was built
// without CUDA, when there is no driver or no device.
COMM_API int cuda_device_count();

}  // namespace comm
