// The memory behind one or more tensors.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "libcomm/device.h"
#include "libcomm/export.h"

namespace comm {

// A Storage is either owned (allocated by libcomm, freed when the last tensor
// that views it goes away) or borrowed (from_blob): borrowed memory is freed
// by the deleter its producer handed over, exactly once, after the last view
// is gone, or never when there is no deleter. Storage is shared through
// shared_ptr and never copied.
class COMM_API Storage {
 public:
  using Deleter = std::function<void(void* data)>;

  // Allocates `nbytes` on `device`: 64-byte aligned host memory, or
  // cudaMalloc on the given CUDA device. Throws InvalidArgument for a CUDA
  // device when libcomm was built without CUDA, and BackendError when CUDA
  // fails.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device);

  // Wraps memory libcomm does not own. `deleter` may be empty.
  static std::shared_ptr<Storage> borrow(void* data, Device device,
                                         Deleter deleter);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, Device device, Deleter deleter);

  void* data_;
  Device device_;
  Deleter deleter_;
};

}  // namespace comm
