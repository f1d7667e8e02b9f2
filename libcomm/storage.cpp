#include "libcomm/storage.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "libcomm/detail/cuda_device.h"

namespace comm {
namespace {

// Host buffers are aligned to a cache line, which also suits every vector
// width the reduction kernels are compiled for.
constexpr std::size_t kHostAlignment = 64;

}  // namespace

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  if (device.is_cuda()) {
    // cudaMalloc(0) returns null, which is fine: nothing will be read.
    void* data =
        nbytes == 0 ? nullptr : detail::cuda_malloc(nbytes, device.index);
    const int ordinal = device.index;
    return std::shared_ptr<Storage>(new Storage(
        data, device, [ordinal](void* p) { detail::cuda_free(p, ordinal); }));
  }
  // aligned_alloc needs a size that is a multiple of the alignment; a zero
  // size still gets a unique, freeable pointer.
  const std::size_t rounded =
      (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* data = std::aligned_alloc(kHostAlignment,
                                  rounded == 0 ? kHostAlignment : rounded);
  if (data == nullptr) throw std::bad_alloc();
  return std::shared_ptr<Storage>(new Storage(data, device, std::free));
}

std::shared_ptr<Storage> Storage::borrow(void* data, Device device,
                                         Deleter deleter) {
  return std::shared_ptr<Storage>(
      new Storage(data, device, std::move(deleter)));
}

Storage::Storage(void* data, Device device, Deleter deleter)
    : data_(data), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

}  // namespace comm
