// Checkpoints in the safetensors format (readable by Python's safetensors,
// PyTorch, JAX and numpy tools): an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and byte range, then the
// tensors' bytes.
//
// save_checkpoint writes from rank 0 only, to a temporary file renamed into
// place, so that a crash never leaves a half-written checkpoint under the
// name; every rank returns once the file is complete (a barrier). Keys are
// the names given: DistributedDataParallel::state() gives the parameters'
// names with no wrapper prefix.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "libcomm/distributed/process_group.h"
#include "libcomm/export.h"
#include "libcomm/tensor.h"

namespace comm {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Every rank calls it with the same path. Throws SystemError when the file
// cannot be written (on rank 0; the others then fail at the barrier's
// timeout or with the error rank 0 reports), InvalidArgument for two
// tensors of one name or a non-contiguous tensor.
COMM_API void save_checkpoint(
    ProcessGroup& group, const std::string& path, const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of the file onto `device`, in file order. Throws
// InvalidArgument naming the file and what is wrong with it (not
// safetensors, truncated, a dtype libcomm lacks), SystemError when it
// cannot be read.
COMM_API NamedTensors load_checkpoint(const std::string& path,
                                      Device device = Device::cpu());

// Copies each loaded tensor into the tensor of the same name in `into`
// (shapes and dtypes must match). Throws InvalidArgument naming a missing
// name or a mismatch; nothing is copied then.
COMM_API void restore(const NamedTensors& loaded, const NamedTensors& into);

// The file format alone, without a group.
COMM_API void write_safetensors(
    const std::string& path, const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata = {});
COMM_API NamedTensors
read_safetensors(const std::string& path, Device device = Device::cpu(),
                 std::map<std::string, std::string>* metadata = nullptr);

}  // namespace comm
