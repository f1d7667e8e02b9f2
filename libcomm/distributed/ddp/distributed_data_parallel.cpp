#include "libcomm/distributed/ddp/distributed_data_parallel.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "libcomm/detail/dispatch.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/reduce_kernels.h"

namespace comm {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// dst[i] = src[i] * scale, converting between dtypes; both host and
// contiguous with the same number of elements.
void cast_scaled(const Tensor& src, Tensor& dst, double scale) {
  const auto count = static_cast<std::size_t>(src.numel());
  detail::dispatch_dtype(src.dtype(), [&]<typename S>() {
    detail::dispatch_dtype(dst.dtype(), [&]<typename D>() {
      const S* in = src.data<S>();
      D* out = dst.data<D>();
      for (std::size_t i = 0; i < count; ++i) {
        double value;
        if constexpr (std::is_same_v<S, Float16> ||
                      std::is_same_v<S, BFloat16>) {
          value = static_cast<float>(in[i]);
        } else {
          value = static_cast<double>(in[i]);
        }
        out[i] = detail::from_double<D>(value * scale);
      }
    });
  });
}

// The same for tensors on any device, staging CUDA tensors through host
// memory.
void cast_scaled_any(const Tensor& src, Tensor& dst, double scale) {
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    cast_scaled(src, dst, scale);
    return;
  }
  const Tensor host_src = src.to(Device::cpu());
  Tensor host_dst = Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
  cast_scaled(host_src, host_dst, scale);
  dst.copy_(host_dst);
}

std::string shape_text(const Shape& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Where each bucket's sent tensor starts in the shared block: a cache line
// of its own, so that no two buckets' reductions write one line.
constexpr std::size_t kBucketAlignment = 64;

std::size_t aligned(std::size_t bytes) {
  return (bytes + kBucketAlignment - 1) / kBucketAlignment * kBucketAlignment;
}

}  // namespace

struct DistributedDataParallel::Bucket {
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  std::vector<std::size_t> params;
  std::size_t elements = 0;
  Tensor flat;
  Tensor compressed;  // the half-precision copy a compression hook sends
  std::size_t pending = 0;
  std::shared_ptr<Work> work;
};

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<ProcessGroup> group, std::vector<Parameter> parameters,
    std::vector<Buffer> buffers, DdpOptions options)
    : group_(std::move(group)),
      parameters_(std::move(parameters)),
      buffers_(std::move(buffers)),
      options_(options) {
  if (!group_) {
    throw InvalidArgument("DistributedDataParallel needs a process group");
  }
  if (options_.bucket_cap_mb <= 0 || options_.first_bucket_mb <= 0) {
    throw InvalidArgument(
        "DistributedDataParallel: bucket_cap_mb and first_bucket_mb must be "
        "positive");
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Parameter& p = parameters_[i];
    const std::string what =
        "DistributedDataParallel: parameter '" + p.name + "'";
    if (!p.data.defined() || !p.grad.defined()) {
      throw InvalidArgument(what + " needs both a tensor and a gradient");
    }
    p.data.check_contiguous(what);
    p.grad.check_contiguous(what + "'s gradient");
    if (p.grad.shape() != p.data.shape() || p.grad.dtype() != p.data.dtype() ||
        p.grad.device() != p.data.device()) {
      throw InvalidArgument(what + ": gradient " + p.grad.describe() +
                            " does not match the parameter " +
                            p.data.describe());
    }
    if (!is_floating(p.data.dtype())) {
      throw InvalidArgument(what + " is " + dtype_name(p.data.dtype()) +
                            "; gradients are averaged, so parameters must "
                            "have a floating dtype");
    }
    if (!by_name_.emplace(p.name, i).second) {
      throw InvalidArgument(
          "DistributedDataParallel: two parameters are "
          "named '" +
          p.name + "'");
    }
  }
  plan_buckets();
  Tensor shared_block = shared_host_block();
  if (!check_same_parameters(shared_block.defined())) shared_block = Tensor();
  // Every rank starts from rank 0's state.
  std::vector<std::shared_ptr<Work>> works;
  for (Parameter& p : parameters_)
    works.push_back(group_->broadcast(p.data, {.root = 0}));
  for (Buffer& b : buffers_)
    works.push_back(group_->broadcast(b.data, {.root = 0}));
  for (auto& w : works) w->wait();
  allocate_buckets(shared_block);
  reset_step();
}

DistributedDataParallel::~DistributedDataParallel() {
  // Leave no collective running on buffers that are about to go.
  for (auto& bucket : buckets_) {
    if (!bucket->work) continue;
    try {
      bucket->work->wait();
    } catch (const std::exception&) {
    }
  }
}

bool DistributedDataParallel::check_same_parameters(bool shares_host_buckets) {
  // Each rank describes its parameters, then its buffers, one line each;
  // the descriptions are gathered through the group (on the parameters'
  // device, so that an NCCL-only group can carry them). Buffers are
  // broadcast from rank 0 at every synchronised forward, so ranks that
  // disagree on them would fail later in a collective that names none.
  // Each rank's word on its host buckets travels with the length of its
  // description.
  std::string mine;
  for (const Parameter& p : parameters_) {
    mine += "'" + p.name + "' " + dtype_name(p.data.dtype()) + " " +
            shape_text(p.data.shape()) + "\n";
  }
  for (const Buffer& b : buffers_) {
    mine += "buffer '" + b.name + "' " + dtype_name(b.data.dtype()) + " " +
            shape_text(b.data.shape()) + "\n";
  }
  const Device device =
      parameters_.empty() ? Device::cpu() : parameters_.front().data.device();
  const int world = group_->size();
  Tensor header = Tensor::zeros({2}, DType::kI64);
  header.data<std::int64_t>()[0] = static_cast<std::int64_t>(mine.size());
  header.data<std::int64_t>()[1] = shares_host_buckets ? 1 : 0;
  Tensor headers = Tensor::zeros({2 * world}, DType::kI64, device);
  group_->all_gather_into(headers, header.to(device))->wait();
  const Tensor host_headers = headers.to(Device::cpu());
  const std::int64_t* header_of = host_headers.data<std::int64_t>();
  std::int64_t longest = 0;
  bool every_rank_shares = true;
  for (int r = 0; r < world; ++r) {
    longest = std::max(longest, header_of[2 * r]);
    every_rank_shares = every_rank_shares && header_of[2 * r + 1] == 1;
  }
  Tensor text = Tensor::zeros({longest}, DType::kU8);
  std::memcpy(text.data_ptr(), mine.data(), mine.size());
  Tensor all = Tensor::zeros({longest * world}, DType::kU8, device);
  group_->all_gather_into(all, text.to(device))->wait();
  const Tensor host_all = all.to(Device::cpu());

  std::vector<std::vector<std::string>> described;
  for (int r = 0; r < world; ++r) {
    const auto* begin =
        reinterpret_cast<const char*>(host_all.data<std::uint8_t>()) +
        r * longest;
    described.push_back(split_lines(
        std::string(begin, static_cast<std::size_t>(header_of[2 * r]))));
  }
  std::size_t most = 0;
  for (const auto& d : described) most = std::max(most, d.size());
  auto entry = [](const std::vector<std::string>& d, std::size_t i) {
    return i < d.size() ? d[i] : std::string("nothing");
  };
  for (std::size_t i = 0; i < most; ++i) {
    std::string differing;
    for (int r = 1; r < world; ++r) {
      if (entry(described[static_cast<std::size_t>(r)], i) !=
          entry(described[0], i)) {
        differing += "; rank " + std::to_string(r) + " has " +
                     entry(described[static_cast<std::size_t>(r)], i);
      }
    }
    if (!differing.empty()) {
      const std::string what =
          i < parameters_.size()
              ? "parameter " + std::to_string(i)
              : "buffer " + std::to_string(i - parameters_.size());
      throw InvalidArgument(
          "DistributedDataParallel: " + what +
          " differs across ranks: rank 0 has " + entry(described[0], i) +
          differing +
          "; every rank must register the same parameters and buffers "
          "(names, dtypes, shapes) in the same order");
    }
  }
  return every_rank_shares;
}

void DistributedDataParallel::plan_buckets() {
  double cap = options_.first_bucket_mb * kMiB;
  Bucket* current = nullptr;
  std::size_t current_bytes = 0;
  bucket_of_.assign(parameters_.size(), 0);
  offset_of_.assign(parameters_.size(), 0);
  // Reverse registration order: the order a backward produces gradients.
  for (std::size_t k = parameters_.size(); k-- > 0;) {
    const Parameter& p = parameters_[k];
    const std::size_t bytes = p.data.nbytes();
    const bool fits = current != nullptr && current->dtype == p.data.dtype() &&
                      current->device == p.data.device() &&
                      static_cast<double>(current_bytes + bytes) <= cap;
    if (!fits) {
      if (current != nullptr) cap = options_.bucket_cap_mb * kMiB;
      buckets_.push_back(std::make_unique<Bucket>());
      current = buckets_.back().get();
      current->dtype = p.data.dtype();
      current->device = p.data.device();
      current_bytes = 0;
    }
    bucket_of_[k] = buckets_.size() - 1;
    offset_of_[k] = current->elements;
    current->params.push_back(k);
    current->elements += static_cast<std::size_t>(p.data.numel());
    current_bytes += bytes;
  }
}

DType DistributedDataParallel::sent_dtype(const Bucket& bucket) const {
  switch (options_.comm_hook) {
    case CommHook::kAllReduce: return bucket.dtype;
    case CommHook::kFp16Compress: return DType::kF16;
    case CommHook::kBf16Compress: return DType::kBF16;
  }
  return bucket.dtype;
}

Tensor DistributedDataParallel::shared_host_block() const {
  const bool every_bucket_on_host =
      std::all_of(buckets_.begin(), buckets_.end(),
                  [](const auto& bucket) { return bucket->device.is_cpu(); });
  if (!options_.shared_host_buckets || group_->size() < 2 || buckets_.empty() ||
      !every_bucket_on_host) {
    return Tensor();
  }
  std::size_t bytes = 0;
  for (const auto& bucket : buckets_) {
    bytes += aligned(bucket->elements * dtype_size(sent_dtype(*bucket)));
  }
  try {
    return Tensor::shared_host_zeros({static_cast<std::int64_t>(bytes)},
                                     DType::kU8);
  } catch (const SystemError& e) {
    COMM_LOG_WARN(
        "DistributedDataParallel: buckets in ordinary memory on every rank, "
        "since this rank could not allocate shared host memory for them: {}",
        e.what());
    return Tensor();
  }
}

void DistributedDataParallel::allocate_buckets(const Tensor& shared_block) {
  auto* next = shared_block.defined()
                   ? static_cast<std::uint8_t*>(shared_block.data_ptr())
                   : nullptr;
  for (auto& bucket : buckets_) {
    const Shape shape{static_cast<std::int64_t>(bucket->elements)};
    const DType sent = sent_dtype(*bucket);
    Tensor in_block;
    if (next != nullptr) {
      // The view keeps the block alive.
      in_block = Tensor::from_blob(next, shape, sent, Device::cpu(),
                                   [shared_block](void*) {});
      next += aligned(bucket->elements * dtype_size(sent));
    }
    if (options_.comm_hook == CommHook::kAllReduce) {
      bucket->flat = in_block.defined()
                         ? in_block
                         : Tensor::zeros(shape, bucket->dtype, bucket->device);
    } else {
      bucket->flat = Tensor::zeros(shape, bucket->dtype, bucket->device);
      bucket->compressed = in_block.defined()
                               ? in_block
                               : Tensor::zeros(shape, sent, bucket->device);
    }
  }
  if (options_.gradient_as_bucket_view) {
    for (auto& bucket_pointer : buckets_) {
      const Bucket& bucket = *bucket_pointer;
      for (std::size_t k : bucket.params) {
        Parameter& p = parameters_[k];
        const auto begin = static_cast<std::int64_t>(offset_of_[k]);
        Tensor view = bucket.flat.slice(begin, begin + p.data.numel())
                          .view(p.data.shape());
        view.copy_(p.grad);
        p.grad = view;
      }
    }
  }
}

std::size_t DistributedDataParallel::index_of(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    throw InvalidArgument("DistributedDataParallel has no parameter named '" +
                          name + "'");
  }
  return it->second;
}

Tensor& DistributedDataParallel::grad(std::size_t index) {
  if (index >= parameters_.size()) {
    throw InvalidArgument("DistributedDataParallel: parameter index " +
                          std::to_string(index) + " is outside [0, " +
                          std::to_string(parameters_.size()) + ")");
  }
  return parameters_[index].grad;
}

std::size_t DistributedDataParallel::bucket_count() const {
  return buckets_.size();
}

std::vector<std::size_t> DistributedDataParallel::bucket_parameters(
    std::size_t b) const {
  return buckets_.at(b)->params;
}

std::vector<std::pair<std::string, Tensor>> DistributedDataParallel::state()
    const {
  std::vector<std::pair<std::string, Tensor>> named;
  for (const Parameter& p : parameters_) named.emplace_back(p.name, p.data);
  return named;
}

void DistributedDataParallel::before_forward(bool backward_follows) {
  if (buffers_due_ && options_.broadcast_buffers && !buffers_.empty()) {
    std::vector<std::shared_ptr<Work>> works;
    for (Buffer& b : buffers_)
      works.push_back(group_->broadcast(b.data, {.root = 0}));
    for (auto& w : works) w->wait();
  }
  if (backward_follows) sync_step_ = !no_sync_;
  buffers_due_ = backward_follows && !no_sync_;
}

bool DistributedDataParallel::syncs_this_step() {
  if (!sync_step_) sync_step_ = !no_sync_;
  return *sync_step_;
}

void DistributedDataParallel::reset_step() {
  marked_.assign(parameters_.size(), false);
  marked_count_ = 0;
  next_launch_ = 0;
  for (auto& bucket : buckets_) {
    bucket->pending = bucket->params.size();
    bucket->work.reset();
  }
}

void DistributedDataParallel::mark_grad_ready(std::size_t index) {
  if (index >= parameters_.size()) {
    throw InvalidArgument("mark_grad_ready: parameter index " +
                          std::to_string(index) + " is outside [0, " +
                          std::to_string(parameters_.size()) + ")");
  }
  if (!syncs_this_step()) return;  // accumulating locally
  if (marked_[index]) {
    throw InvalidArgument("mark_grad_ready: parameter '" +
                          parameters_[index].name +
                          "' was already marked ready in this step");
  }
  Bucket& bucket = *buckets_[bucket_of_[index]];
  Parameter& p = parameters_[index];
  if (!options_.gradient_as_bucket_view) {
    const auto begin = static_cast<std::int64_t>(offset_of_[index]);
    Tensor slot =
        bucket.flat.slice(begin, begin + p.data.numel()).view(p.data.shape());
    slot.copy_(p.grad);
  }
  marked_[index] = true;
  ++marked_count_;
  --bucket.pending;
  if (bucket.pending == 0) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // In bucket order only, so that every rank issues the same collectives
  // in the same order whatever order its gradients became ready in.
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_]->pending == 0) {
    launch(*buckets_[next_launch_]);
    ++next_launch_;
  }
}

void DistributedDataParallel::launch(Bucket& bucket) {
  if (next_launch_ == 0) marked_at_launch_.clear();  // a new step
  marked_at_launch_.push_back(marked_count_);
  if (options_.comm_hook == CommHook::kAllReduce) {
    if (bucket.flat.device().is_cpu()) {
      // Divided first, then summed, as torch's DDP does: a sum of float16
      // gradients could overflow where their average fits.
      divide_by(bucket.flat.dtype(), bucket.flat.data_ptr(),
                static_cast<std::size_t>(bucket.flat.numel()), group_->size());
      bucket.work = group_->all_reduce(bucket.flat);
    } else {
      // NCCL's average, which scales each operand before it sums.
      bucket.work = group_->all_reduce(bucket.flat, {.op = ReduceOp::kAvg});
    }
    return;
  }
  // Divide first, so that the half-precision sum cannot overflow.
  cast_scaled_any(bucket.flat, bucket.compressed, 1.0 / group_->size());
  bucket.work = group_->all_reduce(bucket.compressed);
}

void DistributedDataParallel::finish() {
  const bool sync = syncs_this_step();
  sync_step_.reset();  // the next step decides afresh
  if (!sync) return;
  std::vector<std::string> unused;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (marked_[i]) continue;
    if (options_.find_unused_parameters) {
      // Reduced as zeros: what an unused parameter's gradient is.
      Parameter& p = parameters_[i];
      const auto begin = static_cast<std::int64_t>(offset_of_[i]);
      Tensor slot = buckets_[bucket_of_[i]]
                        ->flat.slice(begin, begin + p.data.numel())
                        .view(p.data.shape());
      slot.copy_(
          Tensor::zeros(p.data.shape(), p.data.dtype(), p.data.device()));
      if (!options_.gradient_as_bucket_view) p.grad.copy_(slot);
      marked_[i] = true;
      ++marked_count_;
      --buckets_[bucket_of_[i]]->pending;
    } else {
      unused.push_back(parameters_[i].name);
    }
  }
  if (!unused.empty()) {
    // Let what was started finish before the buffers are reused.
    for (auto& bucket : buckets_) {
      if (!bucket->work) continue;
      try {
        bucket->work->wait();
      } catch (const std::exception&) {
      }
    }
    reset_step();
    std::string names;
    for (const auto& n : unused)
      names += (names.empty() ? "'" : ", '") + n + "'";
    throw InvalidArgument(
        "DistributedDataParallel::finish: " + std::to_string(unused.size()) +
        " parameter(s) never had their gradient marked ready in this step: " +
        names +
        "; mark them, or construct with find_unused_parameters set "
        "(find_unused_parameters=True in Python) if they take no part in "
        "some steps");
  }
  launch_ready_buckets();
  std::exception_ptr failure;
  for (auto& bucket : buckets_) {
    try {
      bucket->work->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    reset_step();
    std::rethrow_exception(failure);
  }
  for (auto& bucket : buckets_) {
    if (options_.comm_hook != CommHook::kAllReduce)
      cast_scaled_any(bucket->compressed, bucket->flat, 1.0);
    if (options_.gradient_as_bucket_view) continue;
    for (std::size_t k : bucket->params) {
      Parameter& p = parameters_[k];
      const auto begin = static_cast<std::int64_t>(offset_of_[k]);
      p.grad.copy_(bucket->flat.slice(begin, begin + p.data.numel())
                       .view(p.data.shape()));
    }
  }
  reset_step();
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.no_sync_) {
  ddp_.no_sync_ = true;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.no_sync_ = previous_; }

}  // namespace comm
