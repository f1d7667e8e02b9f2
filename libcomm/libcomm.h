// The core of libcomm's public C++ API in one include: tensors and their
// dtypes and devices, reduce ops and their kernels, errors, logging, Work
// and the collectives' options. The layers above it have headers of their
// own: store/store.h (and the stores beside it), backends/backend.h, and
// libcomm/distributed/ (process groups, rendezvous, DDP), whose
// process_group.h is where a program that runs collectives starts.
#pragma once

#include "libcomm/config.h"
#include "libcomm/cuda.h"
#include "libcomm/device.h"
#include "libcomm/dtype.h"
#include "libcomm/enum_param.h"
#include "libcomm/error.h"
#include "libcomm/half.h"
#include "libcomm/int_param.h"
#include "libcomm/logging.h"
#include "libcomm/optional_int_param.h"
#include "libcomm/options.h"
#include "libcomm/param.h"
#include "libcomm/reduce_kernels.h"
#include "libcomm/reduce_op.h"
#include "libcomm/storage.h"
#include "libcomm/string_param.h"
#include "libcomm/tensor.h"
#include "libcomm/tensor_dlpack.h"
#include "libcomm/version.h"
#include "libcomm/work.h"
