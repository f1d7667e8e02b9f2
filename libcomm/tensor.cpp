#include "libcomm/tensor.h"

#include <cstring>
#include <utility>

#include "libcomm/detail/cuda_device.h"
#include "libcomm/detail/dispatch.h"
#include "libcomm/error.h"
#include "libcomm/shared_host_memory.h"

namespace comm {
namespace {

std::int64_t checked_numel(const Shape& shape) {
  std::int64_t numel = 1;
  for (std::int64_t extent : shape) {
    if (extent < 0) {
      throw InvalidArgument("shape " + shape_string(shape) +
                            " has a negative size");
    }
    if (extent != 0 && numel > INT64_MAX / extent) {
      throw InvalidArgument("shape " + shape_string(shape) +
                            " has more elements than fit in int64");
    }
    numel *= extent;
  }
  return numel;
}

// Copies between host tensors of equal shape and dtype with any strides,
// walking the index space in row-major order.
void strided_host_copy(const Tensor& dst, const Tensor& src) {
  const std::int64_t numel = dst.numel();
  if (numel == 0) return;
  const std::size_t elem = dst.element_size();
  const std::int64_t dims = dst.dim();
  std::vector<std::int64_t> index(dims, 0);
  auto* dst_base = static_cast<std::byte*>(dst.data_ptr());
  const auto* src_base = static_cast<const std::byte*>(src.data_ptr());
  std::int64_t dst_pos = 0;
  std::int64_t src_pos = 0;
  for (std::int64_t n = 0; n < numel; ++n) {
    std::memcpy(dst_base + dst_pos * static_cast<std::int64_t>(elem),
                src_base + src_pos * static_cast<std::int64_t>(elem), elem);
    // Advance the index like an odometer, keeping both positions in step.
    for (std::int64_t d = dims - 1; d >= 0; --d) {
      if (++index[d] < dst.shape()[d]) {
        dst_pos += dst.strides()[d];
        src_pos += src.strides()[d];
        break;
      }
      dst_pos -= dst.strides()[d] * (dst.shape()[d] - 1);
      src_pos -= src.strides()[d] * (src.shape()[d] - 1);
      index[d] = 0;
    }
  }
}

}  // namespace

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d > 1; --d) {
    strides[d - 2] = strides[d - 1] * std::max<std::int64_t>(shape[d - 1], 1);
  }
  return strides;
}

std::string shape_string(const std::vector<std::int64_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

const Tensor::Layout Tensor::kNoLayout{};

Tensor::Tensor(std::shared_ptr<Storage> storage, std::int64_t offset,
               Shape shape, Strides strides, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      layout_([&] {
        auto layout = std::make_shared<Layout>();
        layout->shape = std::move(shape);
        layout->strides = std::move(strides);
        // A tensor of no elements is contiguous; for the others the
        // products of trailing sizes fit, as the count does.
        if (checked_numel(layout->shape) == 0) return layout;
        std::int64_t expected = 1;
        for (std::size_t d = layout->shape.size(); d-- > 0;) {
          if (layout->shape[d] != 1 && layout->strides[d] != expected) {
            layout->contiguous = false;
            break;
          }
          expected *= layout->shape[d];
        }
        return layout;
      }()),
      numel_(checked_numel(layout_->shape)),
      dtype_(dtype) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const std::int64_t numel = checked_numel(shape);
  auto storage = Storage::allocate(
      static_cast<std::size_t>(numel) * dtype_size(dtype), device);
  return Tensor(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::shared_host_zeros(const Shape& shape, DType dtype) {
  const std::int64_t numel = checked_numel(shape);
  void* data =
      allocate_shared_host(static_cast<std::size_t>(numel) * dtype_size(dtype));
  std::shared_ptr<Storage> storage;
  try {
    storage = Storage::borrow(data, Device::cpu(), free_shared_host);
  } catch (...) {
    free_shared_host(data);
    throw;
  }
  return Tensor(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype,
                    Device device) {
  Tensor host = empty(shape, dtype);
  detail::dispatch_dtype(dtype, [&]<typename T>() {
    T* data = static_cast<T*>(host.data_ptr());
    const T element = detail::from_double<T>(value);
    for (std::int64_t i = 0; i < host.numel(); ++i) data[i] = element;
  });
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::arange(std::int64_t count, DType dtype, Device device) {
  Tensor host = empty({count}, dtype);
  detail::dispatch_dtype(dtype, [&]<typename T>() {
    T* data = static_cast<T*>(host.data_ptr());
    for (std::int64_t i = 0; i < count; ++i) {
      data[i] = detail::from_double<T>(static_cast<double>(i));
    }
  });
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype,
                         Device device, Storage::Deleter deleter) {
  return from_blob(data, shape, contiguous_strides(shape), dtype, device,
                   std::move(deleter));
}

Tensor Tensor::from_blob(void* data, const Shape& shape, const Strides& strides,
                         DType dtype, Device device, Storage::Deleter deleter) {
  // Take ownership first, so that the deleter runs even when the arguments
  // are rejected below: the producer handed the memory over either way.
  auto storage = Storage::borrow(data, device, std::move(deleter));
  if (strides.size() != shape.size()) {
    throw InvalidArgument("from_blob: shape " + shape_string(shape) + " has " +
                          std::to_string(shape.size()) + " dimensions but " +
                          "strides " + shape_string(strides) + " has " +
                          std::to_string(strides.size()));
  }
  for (std::int64_t stride : strides) {
    if (stride < 0) {
      throw InvalidArgument("from_blob: negative strides " +
                            shape_string(strides) + " are not supported");
    }
  }
  const std::int64_t numel = checked_numel(shape);
  if (data == nullptr && numel > 0) {
    throw InvalidArgument("from_blob: null data for shape " +
                          shape_string(shape));
  }
  return Tensor(std::move(storage), 0, shape, strides, dtype);
}

std::int64_t Tensor::size(std::int64_t d) const {
  const std::int64_t index = d < 0 ? d + dim() : d;
  if (index < 0 || index >= dim()) {
    throw InvalidArgument("dimension " + std::to_string(d) +
                          " is out of range for a tensor of shape " +
                          shape_string(shape()));
  }
  return shape()[index];
}

bool Tensor::is_contiguous() const {
  return numel_ == 0 || layout().contiguous;
}

void* Tensor::data_ptr() const {
  return static_cast<std::byte*>(storage_->data()) +
         offset_ * static_cast<std::int64_t>(element_size());
}

Tensor Tensor::slice(std::int64_t start, std::int64_t end) const {
  if (dim() == 0) {
    throw InvalidArgument("slice: a zero-dimensional tensor has no rows");
  }
  if (start < 0 || end < start || end > shape()[0]) {
    throw InvalidArgument("slice [" + std::to_string(start) + ", " +
                          std::to_string(end) + ") is outside dimension 0 of " +
                          describe());
  }
  Shape shape = this->shape();
  shape[0] = end - start;
  return Tensor(storage_, offset_ + start * strides()[0], std::move(shape),
                strides(), dtype_);
}

Tensor Tensor::view(const Shape& shape) const {
  check_contiguous("view");
  if (checked_numel(shape) != numel_) {
    throw InvalidArgument("view: shape " + shape_string(shape) + " has " +
                          std::to_string(checked_numel(shape)) +
                          " elements but " + describe() + " has " +
                          std::to_string(numel_));
  }
  return Tensor(storage_, offset_, shape, contiguous_strides(shape), dtype_);
}

Tensor Tensor::flatten() const { return view({numel_}); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(Device device) const {
  Tensor copy = empty(shape(), dtype_, device);
  copy.copy_(*this);
  return copy;
}

Tensor Tensor::clone() const { return to(device()); }

Tensor& Tensor::copy_(const Tensor& src) {
  if (src.dtype() != dtype_) {
    throw InvalidArgument("copy_: source " + src.describe() +
                          " and destination " + describe() +
                          " differ in dtype; libcomm does not convert dtypes");
  }
  if (src.shape() != shape()) {
    throw InvalidArgument("copy_: source " + src.describe() +
                          " and destination " + describe() +
                          " differ in shape");
  }
  if (numel_ == 0) return *this;
  const bool both_contiguous = is_contiguous() && src.is_contiguous();
  if (device().is_cpu() && src.device().is_cpu()) {
    if (both_contiguous) {
      std::memmove(data_ptr(), src.data_ptr(), nbytes());
    } else {
      strided_host_copy(*this, src);
    }
    return *this;
  }
  if (!both_contiguous) {
    throw InvalidArgument("copy_ between " + src.describe() + " and " +
                          describe() +
                          " needs contiguous tensors; call contiguous() first");
  }
  detail::cuda_memcpy(data_ptr(), src.data_ptr(), nbytes());
  return *this;
}

void Tensor::check_contiguous(const std::string& what) const {
  if (!is_contiguous()) {
    throw InvalidArgument(what + " needs a contiguous tensor, but got shape " +
                          shape_string(shape()) + " with strides " +
                          shape_string(strides()) +
                          "; call contiguous() to get a contiguous copy");
  }
}

void Tensor::check_dtype(DType expected) const {
  if (dtype_ != expected) {
    throw InvalidArgument(std::string("expected a ") + dtype_name(expected) +
                          " tensor but got " + describe());
  }
}

std::string Tensor::describe() const {
  if (!defined()) return "an undefined tensor";
  std::string text = std::string(dtype_name(dtype_)) + shape_string(shape());
  if (!is_contiguous()) text += " with strides " + shape_string(strides());
  return text + " on " + device().str();
}

}  // namespace comm
