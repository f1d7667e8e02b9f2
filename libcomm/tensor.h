// comm::Tensor: a typed, strided view of CPU or CUDA memory.
//
// A Tensor is a cheap handle: copying it makes another view of the same
// memory (as in PyTorch), and the memory lives until the last view is gone.
// A copy shares the original's shape and strides too, which never change
// once a tensor is made, so copying allocates nothing: a collective call
// that is queued keeps copies of its tensors until it has run.
// Collectives need contiguous tensors and say so when they get another kind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "libcomm/device.h"
#include "libcomm/dtype.h"
#include "libcomm/export.h"
#include "libcomm/storage.h"

namespace comm {

using Shape = std::vector<std::int64_t>;
// Strides count elements, not bytes, as in PyTorch.
using Strides = std::vector<std::int64_t>;

class COMM_API Tensor {
 public:
  // An undefined tensor: defined() is false and nothing else may be asked.
  Tensor() = default;

  // Factories. Each allocates fresh, contiguous memory on `device`.
  static Tensor empty(const Shape& shape, DType dtype,
                      Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype,
                      Device device = Device::cpu());
  // Every element set to `value` converted to `dtype` (rounded to nearest
  // for the half types; for bool, any non-zero value is true).
  static Tensor full(const Shape& shape, double value, DType dtype,
                     Device device = Device::cpu());
  // Zeros on the host, in shared host memory (libcomm/shared_host_memory.h),
  // freed with the last view: a collective among ranks of one host whose
  // every rank passes such tensors reads them directly, with a plain copy.
  // Throws SystemError where the kernel refuses the memory.
  static Tensor shared_host_zeros(const Shape& shape, DType dtype);
  // The one-dimensional tensor 0, 1, ..., count - 1.
  static Tensor arange(std::int64_t count, DType dtype,
                       Device device = Device::cpu());

  // Views memory libcomm does not own. The tensor never frees it; when
  // `deleter` is given it is called exactly once, with `data`, after the last
  // view of this memory is gone. Without `strides` the tensor is contiguous.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          Device device = Device::cpu(),
                          Storage::Deleter deleter = {});
  static Tensor from_blob(void* data, const Shape& shape,
                          const Strides& strides, DType dtype,
                          Device device = Device::cpu(),
                          Storage::Deleter deleter = {});

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  const Shape& shape() const { return layout().shape; }
  const Strides& strides() const { return layout().strides; }
  std::int64_t dim() const {
    return static_cast<std::int64_t>(layout().shape.size());
  }
  // The size of dimension `d`; negative `d` counts from the end.
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const { return numel_; }
  std::size_t element_size() const { return dtype_size(dtype_); }
  std::size_t nbytes() const { return numel_ * element_size(); }
  // The position of element [0, ..., 0] in the storage, in elements.
  std::int64_t storage_offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Row-major with no gaps. Dimensions of size 1 may have any stride, and a
  // tensor with no elements is contiguous.
  bool is_contiguous() const;

  // The address of element [0, ..., 0].
  void* data_ptr() const;
  // data_ptr() as T*; throws InvalidArgument when T is not this dtype.
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }

  // Rows [start, end) of dimension 0, sharing this tensor's memory.
  // Collectives cut tensors into chunks with it. Throws InvalidArgument for a
  // zero-dimensional tensor or a range outside [0, size(0)].
  Tensor slice(std::int64_t start, std::int64_t end) const;
  // The same memory seen with another shape of the same numel. Only for
  // contiguous tensors.
  Tensor view(const Shape& shape) const;
  // view({numel()}).
  Tensor flatten() const;
  // This tensor if it is contiguous, else a contiguous copy.
  Tensor contiguous() const;
  // A contiguous copy on `device`.
  Tensor to(Device device) const;
  Tensor clone() const;

  // Copies `src` into this tensor. Both must have the same dtype and shape;
  // any mix of host and CUDA memory is allowed (the copy is synchronous), and
  // strided copies are allowed between host tensors. Returns *this.
  Tensor& copy_(const Tensor& src);

  // Throws InvalidArgument, naming `what`, the shape and the strides, unless
  // the tensor is contiguous.
  void check_contiguous(const std::string& what) const;
  // Throws InvalidArgument naming both dtypes unless dtype() == expected.
  void check_dtype(DType expected) const;

  // For messages: "float32[2, 3] on cpu", with the strides when the tensor
  // is not contiguous.
  std::string describe() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, std::int64_t offset, Shape shape,
         Strides strides, DType dtype);

  struct Layout {
    Shape shape;
    Strides strides;
    // Row-major without gaps (is_contiguous()), worked out once: every
    // collective checks it, and a small call cannot afford the loop.
    bool contiguous = true;
  };
  // An undefined tensor's: no dimensions.
  static const Layout kNoLayout;
  const Layout& layout() const { return layout_ ? *layout_ : kNoLayout; }

  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;
  std::shared_ptr<const Layout> layout_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

// The row-major strides of `shape`.
COMM_API Strides contiguous_strides(const Shape& shape);

// "[2, 3]".
COMM_API std::string shape_string(const std::vector<std::int64_t>& dims);

}  // namespace comm
