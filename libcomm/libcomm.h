// The whole public C++ API of libcomm in one include.
#pragma once

#include "libcomm/config.h"
#include "libcomm/cuda.h"
#include "libcomm/device.h"
#include "libcomm/dtype.h"
#include "libcomm/error.h"
#include "libcomm/half.h"
#include "libcomm/logging.h"
#include "libcomm/reduce_kernels.h"
#include "libcomm/reduce_op.h"
#include "libcomm/storage.h"
#include "libcomm/tensor.h"
#include "libcomm/tensor_dlpack.h"
#include "libcomm/version.h"
