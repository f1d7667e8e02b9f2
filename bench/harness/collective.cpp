#include "bench/harness/collective.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "libcomm/detail/dispatch.h"
#include "libcomm/error.h"

namespace comm::bench {

const Collective& all_reduce_collective();
const Collective& all_gather_collective();
const Collective& broadcast_collective();
const Collective& reduce_collective();
const Collective& reduce_scatter_collective();
const Collective& alltoall_collective();
const Collective& gather_collective();
const Collective& scatter_collective();
const Collective& sendrecv_collective();

namespace {

const std::vector<const Collective*>& all_collectives() {
  static const std::vector<const Collective*> list = {
      &all_reduce_collective(),     &all_gather_collective(),
      &broadcast_collective(),      &reduce_collective(),
      &reduce_scatter_collective(), &alltoall_collective(),
      &gather_collective(),         &scatter_collective(),
      &sendrecv_collective()};
  return list;
}

// What the dtype makes of an exact integer result: integers wrap (C++20
// defines the conversion from int64 as modular), bool is "non-zero", the
// floating types round.
double as_dtype(DType dtype, double value) {
  return detail::dispatch_dtype(dtype, [&]<typename T>() -> double {
    if constexpr (std::is_same_v<T, bool>) {
      return value != 0.0 ? 1.0 : 0.0;
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<double>(
          static_cast<T>(static_cast<std::int64_t>(value)));
    } else if constexpr (std::is_same_v<T, Float16> ||
                         std::is_same_v<T, BFloat16>) {
      return static_cast<double>(static_cast<float>(T(value)));
    } else {
      return static_cast<double>(static_cast<T>(value));
    }
  });
}

double ulp(DType dtype) {
  switch (dtype) {
    case DType::kF16: return std::ldexp(1.0, -10);
    case DType::kBF16: return std::ldexp(1.0, -7);
    case DType::kF32: return std::ldexp(1.0, -23);
    case DType::kF64: return std::ldexp(1.0, -52);
    default: return 0.0;
  }
}

}  // namespace

std::size_t Collective::count_for(std::int64_t bytes, DType dtype,
                                  int world) const {
  const std::size_t elements =
      static_cast<std::size_t>(bytes) / dtype_size(dtype);
  return size_is_total() ? elements / static_cast<std::size_t>(world)
                         : elements;
}

std::int64_t Collective::bytes_for(std::size_t count, DType dtype,
                                   int world) const {
  const std::size_t bytes = count * dtype_size(dtype);
  return static_cast<std::int64_t>(
      size_is_total() ? bytes * static_cast<std::size_t>(world) : bytes);
}

const Collective& find_collective(const std::string& name) {
  for (const Collective* c : all_collectives()) {
    if (name == c->name()) return *c;
  }
  std::string known;
  for (const auto& n : collective_names()) known += " " + n;
  throw InvalidArgument("no collective named '" + name + "'; known:" + known);
}

std::vector<std::string> collective_names() {
  std::vector<std::string> names;
  for (const Collective* c : all_collectives()) names.emplace_back(c->name());
  return names;
}

double input_value(DType dtype, ReduceOp op, int rank, std::size_t index) {
  const auto r = static_cast<std::size_t>(rank);
  if (dtype == DType::kBool) return static_cast<double>((r + index) % 2);
  if (op == ReduceOp::kProduct) return static_cast<double>(1 + (r + index) % 2);
  return static_cast<double>(1 + (r * 7 + index) % 5);
}

double reduced_value(DType dtype, ReduceOp op, int world, std::size_t index) {
  double acc = input_value(dtype, op, 0, index);
  for (int rank = 1; rank < world; ++rank) {
    const double v = input_value(dtype, op, rank, index);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand:
        acc = static_cast<double>(static_cast<std::int64_t>(acc) &
                                  static_cast<std::int64_t>(v));
        break;
      case ReduceOp::kBor:
        acc = static_cast<double>(static_cast<std::int64_t>(acc) |
                                  static_cast<std::int64_t>(v));
        break;
      case ReduceOp::kBxor:
        acc = static_cast<double>(static_cast<std::int64_t>(acc) ^
                                  static_cast<std::int64_t>(v));
        break;
    }
  }
  acc = as_dtype(dtype, acc);
  if (op == ReduceOp::kAvg) {
    acc = is_floating(dtype) ? acc / world : std::trunc(acc / world);
    acc = as_dtype(dtype, acc);
  }
  return acc;
}

void fill(Tensor& t, const std::function<double(std::size_t)>& value) {
  Tensor host = t.device().is_cpu()
                    ? t
                    : Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  const auto count = static_cast<std::size_t>(host.numel());
  detail::dispatch_dtype(t.dtype(), [&]<typename T>() {
    T* data = host.data<T>();
    for (std::size_t i = 0; i < count; ++i)
      data[i] = detail::from_double<T>(value(i));
  });
  if (!t.device().is_cpu()) t.copy_(host);
}

void fill(Tensor& t, const std::vector<double>& values) {
  fill(t, [&](std::size_t i) { return values[i]; });
}

Tensor zeros_for(const Case& c, std::int64_t count) {
  if (c.shared_host) return Tensor::shared_host_zeros({count}, c.dtype);
  return Tensor::zeros({count}, c.dtype, c.device);
}

Tensor filled(const Case& c, const std::function<double(std::size_t)>& value) {
  Tensor t = zeros_for(c, static_cast<std::int64_t>(c.count));
  fill(t, value);
  return t;
}

std::vector<double> values_of(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<double> values(static_cast<std::size_t>(host.numel()));
  detail::dispatch_dtype(host.dtype(), [&]<typename T>() {
    const T* data = host.data<T>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
        values[i] = static_cast<double>(static_cast<float>(data[i]));
      } else {
        values[i] = static_cast<double>(data[i]);
      }
    }
  });
  return values;
}

void prepare_in_place_api(Case& c,
                          const std::function<double(std::size_t)>& value) {
  Tensor input = filled(c, value);
  c.inputs = {input};
  if (c.in_place) {
    c.outputs = {input};
  } else {
    c.source = input;
    c.outputs = {zeros_for(c, input.numel())};
  }
}

void refill_output(Case& c) {
  if (!c.source.defined()) return;
  if (c.output_user) c.output_user->wait();
  c.outputs[0].copy_(c.source);
}

std::shared_ptr<Work> uses_output(Case& c, std::shared_ptr<Work> work) {
  if (c.source.defined()) c.output_user = work;
  return work;
}

std::int64_t count_wrong(const Collective& collective, const Case& c) {
  std::int64_t wrong = 0;
  std::size_t index = 0;
  const double tolerance = 2 * ulp(c.dtype);
  for (const Tensor& output : c.outputs) {
    const Tensor host =
        output.device().is_cpu() ? output : output.to(Device::cpu());
    const auto count = static_cast<std::size_t>(host.numel());
    detail::dispatch_dtype(host.dtype(), [&]<typename T>() {
      const T* data = host.data<T>();
      for (std::size_t i = 0; i < count; ++i) {
        const double want = collective.expected(c, index++);
        if (std::isnan(want)) continue;
        double got;
        if constexpr (std::is_same_v<T, Float16> ||
                      std::is_same_v<T, BFloat16>) {
          got = static_cast<double>(static_cast<float>(data[i]));
        } else {
          got = static_cast<double>(data[i]);
        }
        if (!(std::fabs(got - want) <=
              tolerance * std::max(1.0, std::fabs(want))))
          ++wrong;
      }
    });
  }
  return wrong;
}

}  // namespace comm::bench
