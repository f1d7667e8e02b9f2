#include "backends/tcp/tcp_backend.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory_resource>
#include <span>
#include <vector>

#include "backends/tcp/algorithms.h"
#include "backends/tcp/collective_context.h"
#include "backends/tcp/collective_scheduler.h"
#include "backends/tcp/control_channel.h"
#include "backends/tcp/control_message.h"
#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/point_to_point.h"
#include "backends/tcp/reported_failure.h"
#include "backends/workspace.h"
#include "libcomm/detail/collective_args.h"
#include "libcomm/detail/copy_bytes.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"
#include "libcomm/param.h"
#include "libcomm/reduce_kernels.h"

namespace comm {

using detail::overlaps;
using tcp::CallInfo;
using tcp::Collective;
using tcp::CollectiveContext;
// The collective algorithms; never plain `reduce`, which names the kernel
// and the Backend method.
namespace alg = tcp::algorithms;

namespace {

const IntParam kWorkspaceBytes{
    "COMM_TCP_WORKSPACE_BYTES", 32 << 20, 0, std::int64_t{1} << 40,
    "bytes of its collectives' temporary buffers a group keeps between calls"};

// The host memory a call works on: the tensor itself, or a host copy of a
// CUDA tensor (with its contents when `copy_in`).
Tensor on_host(const Tensor& tensor, bool copy_in) {
  if (tensor.device().is_cpu()) return tensor;
  return copy_in ? tensor.to(Device::cpu())
                 : Tensor::empty(tensor.shape(), tensor.dtype(), Device::cpu());
}

// The same without copying a CPU tensor's handle (two shared reference
// counts to bump and drop): a CUDA tensor's host copy goes into `staged`,
// which must outlive the reference returned.
const Tensor& on_host(const Tensor& tensor, bool copy_in, Tensor& staged) {
  if (tensor.device().is_cpu()) return tensor;
  staged = on_host(tensor, copy_in);
  return staged;
}

// Copies a staged result back to its CUDA tensor (nothing for CPU ones).
void from_host(Tensor& tensor, const Tensor& host) {
  if (!tensor.device().is_cpu()) tensor.copy_(host);
}

std::uint8_t* bytes_of(const Tensor& tensor) {
  return static_cast<std::uint8_t*>(tensor.data_ptr());
}

// The host memory of a list of tensors, as on_host gives it: a pointer to
// each tensor's data, in a host copy for a CUDA tensor. The lists stay on
// the stack while they fit, since heap allocations are a good part of a
// small call, and a CPU tensor's handle is not copied.
template <typename Pointer>
class OnHostList {
 public:
  // Parentheses: braces would make a list of one pointer, &arena_.
  OnHostList(std::span<const Tensor> tensors, bool copy_in)
      : pointers_(&arena_), staged_(&arena_) {
    pointers_.reserve(tensors.size());
    for (const Tensor& tensor : tensors) {
      if (tensor.device().is_cpu()) {
        pointers_.push_back(tensor.data_ptr());
      } else {
        staged_.push_back(on_host(tensor, copy_in));
        pointers_.push_back(staged_.back().data_ptr());
      }
    }
  }
  OnHostList(const OnHostList&) = delete;
  OnHostList& operator=(const OnHostList&) = delete;

  std::span<const Pointer> pointers() const { return pointers_; }
  // Copies the host copies back to their CUDA tensors, `tensors` being
  // the list given.
  void copy_back(std::span<Tensor> tensors) const {
    std::size_t next = 0;
    for (Tensor& tensor : tensors) {
      if (!tensor.device().is_cpu()) tensor.copy_(staged_[next++]);
    }
  }

 private:
  alignas(std::max_align_t) std::byte memory_[512];
  std::pmr::monotonic_buffer_resource arena_{memory_, sizeof(memory_)};
  std::pmr::vector<Pointer> pointers_;
  std::pmr::vector<Tensor> staged_;
};

// all_gather of `blocks`, of which this rank's (`blocks[rank]`) is to hold
// `mine`. Unless `mine` overlaps the output (`apart` false: in place, or
// overlapping another rank's block, which the gather would overwrite
// before sending `mine`), the peers take this rank's block from `mine`,
// and it is copied into its place only after: a peer that reads it
// (single copy) then reads memory this rank has not just written, which
// costs a peer's core far less (bench/README.md, "Single copy"), and the
// copy delays nothing the peers wait for.
void all_gather_from(CollectiveContext& ctx, std::span<void*> blocks,
                     const void* mine, std::size_t bytes, bool apart) {
  void*& slot = blocks[static_cast<std::size_t>(ctx.rank())];
  void* const own = slot;
  if (bytes == 0 || own == mine) {
    alg::all_gather(ctx, blocks, bytes);
  } else if (apart) {
    slot = const_cast<void*>(mine);
    alg::all_gather(ctx, blocks, bytes);
    detail::copy_bytes(own, mine, bytes);
  } else {
    std::memmove(own, mine, bytes);
    alg::all_gather(ctx, blocks, bytes);
  }
}

}  // namespace

TcpBackend::TcpBackend(std::shared_ptr<Store> store, int rank, int size,
                       std::chrono::milliseconds timeout)
    : Backend(rank, size), timeout_(timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("TcpBackend: rank " + std::to_string(rank) +
                          " is outside [0, " + std::to_string(size) + ")");
  }
  // A malformed knob fails here, when the group is created, rather than in
  // the middle of the first collective that reads it.
  read_params("COMM_TCP_");
  read_params("COMM_TRANSPORT");
  read_params("COMM_SHM_");
  read_params("COMM_REDUCE_");
  read_params("COMM_HEARTBEAT_");
  mesh_ = std::make_unique<tcp::Mesh>(*store, rank, size, timeout);
  control_ = std::make_unique<tcp::ControlChannel>(
      *mesh_, tcp::heartbeat_timeout(), tcp::heartbeat_interval());
  p2p_ = std::make_unique<tcp::PointToPoint>(*mesh_, *control_);
  workspace_ = std::make_unique<Workspace>(
      static_cast<std::size_t>(kWorkspaceBytes.get()));
  scheduler_ = tcp::CollectiveScheduler::start(
      rank, [this](tcp::CollectiveTask& task) { execute(task); });
}

TcpBackend::~TcpBackend() { shutdown(); }

void TcpBackend::shutdown() {
  if (!scheduler_->shutdown()) return;
  // Confirmations of the last rooted calls may still be owed, either way
  // (tcp::Exchange::send_confirmation): this rank sends what it owes, so
  // that its peers need not wait for it, and reads what it is owed for a
  // while. A peer whose confirmation is still unread may send it after
  // this rank has closed, and over TCP the reset that answers it discards
  // what this rank's send queue to that peer still holds; so this rank
  // waits, up to its timeout, for those bytes to arrive first, as a root
  // that waited for the confirmation in the call would have. After a
  // failure the channels are abandoned as they are. A confirmation that
  // names another call fails no call of this rank any more, but is
  // reported to the peers all the same.
  if (!scheduler_->broken()) {
    try {
      tcp::Exchange::finish_confirmations(
          *mesh_, control_.get(),
          detail::deadline_after(std::min<std::chrono::milliseconds>(
              timeout_, kConfirmationLinger)));
    } catch (const std::exception& e) {
      // A mismatch was logged as an error, and reported, where it was
      // found (report_failure); a late peer is only worth a debug line.
      COMM_LOG_DEBUG(
          "rank {} shut down without its peers' last "
          "confirmations: {}",
          rank(), e.what());
    }
    std::vector<int> unconfirmed;
    for (int peer = 0; peer < size(); ++peer) {
      if (!mesh_->confirmations(peer).unread.empty()) {
        unconfirmed.push_back(peer);
      }
    }
    if (!mesh_->wait_until_delivered(unconfirmed,
                                     detail::deadline_after(timeout_))) {
      COMM_LOG_WARN(
          "rank {} shut down before its last messages to ranks "
          "that had not confirmed them had arrived",
          rank());
    }
  }
  p2p_->stop(std::make_exception_ptr(BackendError(
      "the process group was shut down with this operation pending")));
  // A peer still waiting for this rank then names an early end, not a
  // crash (tcp::Exchange::read_last_words); a broken group's peers have
  // had its report.
  if (!scheduler_->broken()) {
    control_->announce_leaving(scheduler_->abandoned(), kLeavingBudget);
  }
  control_->stop();
  mesh_->shutdown_all();
}

void TcpBackend::check_open() const { scheduler_->check_open(); }

std::chrono::milliseconds TcpBackend::resolve(OpTimeout timeout) const {
  return timeout == kDefaultTimeout ? timeout_ : timeout;
}

template <typename Options, typename Body, typename... Held>
std::shared_ptr<Work> TcpBackend::enqueue(const CallInfo& call,
                                          const Options& options, Body&& body,
                                          Held&&... held) {
  return scheduler_->enqueue(call, resolve(options.timeout), !options.async_op,
                             std::forward<Body>(body),
                             std::forward<Held>(held)...);
}

void TcpBackend::execute(tcp::CollectiveTask& task) {
  const CallInfo& call = task.call;
  const auto deadline = detail::deadline_after(task.timeout);
  // Starts moving the first lines of each ring to a local peer (see
  // shm::Ring::prefetch_write) while the call is set up.
  for (int peer : mesh_->local_peers().local_ranks()) {
    if (const shm::Ring* ring =
            mesh_->ring(peer, tcp::Channel::kCollective, true)) {
      ring->prefetch_write();
    }
  }
  try {
    // A failure the peers reported before this rank got here (a peer that
    // timed out waiting for this late rank, say) fails the call before it
    // reads data that the peers sent before they gave up; one reported
    // while the call ran fails it even when its own transfers finished.
    // See "Failures" in docs/design.md for the contract.
    if (auto report = control_->begin_call(call)) {
      tcp::raise_report(call, *report);
    }
    CollectiveContext ctx{
        *mesh_,     *control_, call, deadline, scheduler_->interrupt_fd(),
        *workspace_};
    task.run_body(ctx);
    if (auto report = control_->check(call)) tcp::raise_report(call, *report);
  } catch (const tcp::ReportedFailure&) {
    // The others know already: a peer reported it, or it is a timeout the
    // exchange told them about.
    throw;
  } catch (...) {
    tcp::report_failure(*control_, call, rank());
    throw;
  }
}

std::shared_ptr<Work> TcpBackend::do_broadcast(
    Tensor& tensor, const BroadcastOptions& options) {
  CallInfo call{Collective::kBroadcast, 0,
                tensor.dtype(),         tensor.numel(),
                ReduceOp::kSum,         options.root};
  return enqueue(
      call, options,
      [this, options](CollectiveContext& ctx, Tensor& buffer) {
        const bool is_root = rank() == options.root;
        Tensor staged;
        const Tensor& host = on_host(buffer, is_root, staged);
        alg::broadcast(ctx, host.data_ptr(), host.nbytes(), options.root);
        from_host(buffer, host);
      },
      tensor);
}

std::shared_ptr<Work> TcpBackend::do_reduce(Tensor& tensor,
                                            const ReduceOptions& options) {
  CallInfo call{Collective::kReduce, 0,          tensor.dtype(),
                tensor.numel(),      options.op, options.root};
  return enqueue(
      call, options,
      [this, options](CollectiveContext& ctx, Tensor& buffer) {
        Tensor staged;
        const Tensor& host = on_host(buffer, true, staged);
        const auto count = static_cast<std::size_t>(host.numel());
        const bool average = options.op == ReduceOp::kAvg;
        const bool divided_first =
            average && averages_divided_first(host.dtype());
        // A non-root's tensor is scratch (Backend::reduce), so each rank
        // may divide its own in place.
        if (divided_first)
          divide_by(host.dtype(), host.data_ptr(), count, size());
        alg::reduce(ctx, host.data_ptr(), count, host.dtype(), options.op,
                    options.root);
        if (rank() == options.root) {
          if (average && !divided_first) {
            divide_by(host.dtype(), host.data_ptr(), count, size());
          }
          from_host(buffer, host);
        }
      },
      tensor);
}

std::shared_ptr<Work> TcpBackend::do_all_reduce(
    Tensor& tensor, const AllReduceOptions& options) {
  return do_all_reduce_into(tensor, tensor, options);
}

std::shared_ptr<Work> TcpBackend::do_all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  // In place or not, the same call on the wire: ranks may mix the forms.
  CallInfo call{Collective::kAllReduce, 0,          input.dtype(),
                input.numel(),          options.op, -1};
  return enqueue(
      call, options,
      [this, options](CollectiveContext& ctx, Tensor& result,
                      const Tensor& operand) {
        const bool in_place = result.data_ptr() == operand.data_ptr();
        Tensor staged_result, staged_operand;
        const Tensor& host = on_host(result, in_place, staged_result);
        const Tensor& host_input =
            in_place ? host : on_host(operand, true, staged_operand);
        const auto count = static_cast<std::size_t>(host.numel());
        const bool average = options.op == ReduceOp::kAvg;
        const bool divided_first =
            average && averages_divided_first(host.dtype());
        const void* source = host_input.data_ptr();
        if (divided_first) {
          // The input is left as it was: its quotients go to the output,
          // which is then reduced in place.
          if (!in_place) {
            detail::copy_bytes(host.data_ptr(), source, host.nbytes());
          }
          divide_by(host.dtype(), host.data_ptr(), count, size());
          source = host.data_ptr();
        }
        alg::all_reduce(ctx, source, host.data_ptr(), count, host.dtype(),
                        options.op);
        if (average && !divided_first) {
          divide_by(host.dtype(), host.data_ptr(), count, size());
        }
        from_host(result, host);
      },
      output, input);
}

std::shared_ptr<Work> TcpBackend::do_all_gather(
    std::vector<Tensor>& outputs, const Tensor& input,
    const AllGatherOptions& options) {
  CallInfo call{Collective::kAllGather, 0, input.dtype(), input.numel(),
                ReduceOp::kSum,         -1};
  return enqueue(
      call, options,
      [this](CollectiveContext& ctx, std::vector<Tensor>& results,
             const Tensor& contribution) {
        std::vector<Tensor> hosts;
        std::vector<void*> blocks;
        hosts.reserve(results.size());
        blocks.reserve(results.size());
        for (int r = 0; r < size(); ++r) {
          hosts.push_back(on_host(results[r], false));
          blocks.push_back(hosts.back().data_ptr());
        }
        Tensor staged;
        const Tensor& mine = on_host(contribution, true, staged);
        const bool apart =
            std::none_of(hosts.begin(), hosts.end(),
                         [&](const Tensor& h) { return overlaps(h, mine); });
        all_gather_from(ctx, blocks, mine.data_ptr(), contribution.nbytes(),
                        apart);
        for (int r = 0; r < size(); ++r) from_host(results[r], hosts[r]);
      },
      outputs, input);
}

std::shared_ptr<Work> TcpBackend::do_all_gather_into(
    Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  CallInfo call{Collective::kAllGather, 0, input.dtype(), input.numel(),
                ReduceOp::kSum,         -1};
  return enqueue(
      call, options,
      [this](CollectiveContext& ctx, Tensor& result,
             const Tensor& contribution) {
        Tensor host = on_host(result, false);
        const std::size_t bytes = contribution.nbytes();
        // On the stack while they fit: a heap allocation is a good part of
        // a small call.
        alignas(std::max_align_t) std::byte blocks_memory[512];
        std::pmr::monotonic_buffer_resource arena(blocks_memory,
                                                  sizeof(blocks_memory));
        std::pmr::vector<void*> blocks(static_cast<std::size_t>(size()),
                                       nullptr, &arena);
        for (int r = 0; r < size(); ++r)
          blocks[static_cast<std::size_t>(r)] = bytes_of(host) + r * bytes;
        Tensor staged;
        const Tensor& mine = on_host(contribution, true, staged);
        all_gather_from(ctx, blocks, mine.data_ptr(), bytes,
                        !overlaps(host, mine));
        from_host(result, host);
      },
      output, input);
}

std::shared_ptr<Work> TcpBackend::do_gather(std::vector<Tensor>& outputs,
                                            const Tensor& input,
                                            const GatherOptions& options) {
  CallInfo call{Collective::kGather, 0,           input.dtype(), input.numel(),
                ReduceOp::kSum,      options.root};
  return enqueue(
      call, options,
      [options](CollectiveContext& ctx, std::vector<Tensor>& results,
                const Tensor& contribution) {
        Tensor staged;
        const Tensor& mine = on_host(contribution, true, staged);
        const OnHostList<void*> blocks(results, false);
        alg::gather(ctx, mine.data_ptr(), blocks.pointers(),
                    contribution.nbytes(), options.root);
        blocks.copy_back(results);
      },
      outputs, input);
}

std::shared_ptr<Work> TcpBackend::do_scatter(Tensor& output,
                                             const std::vector<Tensor>& inputs,
                                             const ScatterOptions& options) {
  CallInfo call{Collective::kScatter, 0,
                output.dtype(),       output.numel(),
                ReduceOp::kSum,       options.root};
  return enqueue(
      call, options,
      [options](CollectiveContext& ctx, Tensor& result,
                const std::vector<Tensor>& sources) {
        Tensor staged;
        const Tensor& host = on_host(result, false, staged);
        const OnHostList<const void*> blocks(sources, true);
        alg::scatter(ctx, blocks.pointers(), host.data_ptr(), result.nbytes(),
                     options.root);
        from_host(result, host);
      },
      output, inputs);
}

std::shared_ptr<Work> TcpBackend::do_reduce_scatter(
    Tensor& output, const std::vector<Tensor>& inputs,
    const ReduceScatterOptions& options) {
  CallInfo call{Collective::kReduceScatter,
                0,
                output.dtype(),
                output.numel(),
                options.op,
                -1};
  return enqueue(
      call, options,
      [this, options](CollectiveContext& ctx, Tensor& reduced,
                      const std::vector<Tensor>& operands) {
        // The algorithm writes partial sums into the reduced before
        // it has read every input, so a CPU reduced that is one of the
        // operands (in place) gets a buffer of its own, from the call's
        // workspace. (A CUDA reduced is staged on the host anyway, apart
        // from the operands' host copies.)
        const bool aliased =
            reduced.device().is_cpu() &&
            std::any_of(operands.begin(), operands.end(),
                        [&](const Tensor& in) {
                          return in.data_ptr() == reduced.data_ptr();
                        });
        const std::size_t bytes = reduced.nbytes();
        Tensor staged;
        void* result = aliased ? ctx.workspace()->take(bytes)
                               : on_host(reduced, false, staged).data_ptr();
        const OnHostList<const void*> blocks(operands, true);
        const auto count = static_cast<std::size_t>(reduced.numel());
        const bool average = options.op == ReduceOp::kAvg;
        const bool divided_first =
            average && averages_divided_first(reduced.dtype());
        std::span<const void* const> sources = blocks.pointers();
        std::vector<const void*> quotients;
        if (divided_first) {
          // The inputs are left as they were: their quotients are reduced,
          // from the call's workspace.
          std::uint8_t* space = ctx.workspace()->take(bytes * sources.size());
          for (const void* block : sources) {
            detail::copy_bytes(space, block, bytes);
            divide_by(reduced.dtype(), space, count, size());
            quotients.push_back(space);
            space += bytes;
          }
          sources = quotients;
        }
        alg::reduce_scatter(ctx, sources, result, count, reduced.dtype(),
                            options.op);
        if (average && !divided_first) {
          divide_by(reduced.dtype(), result, count, size());
        }
        if (aliased) {
          detail::copy_bytes(reduced.data_ptr(), result, bytes);
        } else {
          from_host(reduced, staged);
        }
      },
      output, inputs);
}

std::shared_ptr<Work> TcpBackend::do_all_to_all(
    Tensor& output, const Tensor& input, const AllToAllOptions& options) {
  // Checked by Backend::all_to_all; the TCP algorithm works in bytes.
  detail::AllToAllLayout layout =
      detail::all_to_all_layout(output, input, options.input_split_sizes,
                                options.output_split_sizes, size());
  layout.scale(input.element_size());
  CallInfo call{Collective::kAllToAll, 0, input.dtype(), 0, ReduceOp::kSum, -1};
  // The layout moves into the body (and with it into a queued task): in a
  // large group its arrays are a heap allocation, which a copy would make
  // again.
  return enqueue(
      call, options,
      [layout = std::move(layout)](CollectiveContext& ctx, Tensor& result,
                                   const Tensor& source) {
        Tensor staged;
        const Tensor& in = on_host(source, true, staged);
        Tensor out = on_host(result, false);
        // In place (one buffer for both), a block received early
        // would overwrite one not yet sent: send from a copy, in the
        // workspace.
        const std::uint8_t* from = bytes_of(in);
        if (overlaps(in, out)) {
          std::uint8_t* copy = ctx.workspace()->take(in.nbytes());
          detail::copy_bytes(copy, from, in.nbytes());
          from = copy;
        }
        alg::all_to_all(ctx, from, layout.send_offsets(), layout.send_counts(),
                        bytes_of(out), layout.receive_offsets(),
                        layout.receive_counts(), bytes_of(in));
        from_host(result, out);
      },
      output, input);
}

std::shared_ptr<Work> TcpBackend::do_barrier(const BarrierOptions& options) {
  CallInfo call{Collective::kBarrier, 0, DType::kU8, 0, ReduceOp::kSum, -1};
  return enqueue(call, options,
                 [](CollectiveContext& ctx) { alg::barrier(ctx); });
}

std::shared_ptr<Work> TcpBackend::point_to_point_work(const char* kind,
                                                      const Tensor& tensor,
                                                      int tag,
                                                      const std::string& peer) {
  check_open();
  const std::uint64_t id = next_p2p_.fetch_add(1, std::memory_order_relaxed);
  return std::make_shared<Work>(std::string(kind) + " #" + std::to_string(id) +
                                " (" + dtype_name(tensor.dtype()) + " x " +
                                std::to_string(tensor.numel()) + ", tag " +
                                std::to_string(tag) + ") " + peer);
}

std::shared_ptr<Work> TcpBackend::do_send(const Tensor& tensor, int dst,
                                          const SendOptions& options) {
  auto work = point_to_point_work("send", tensor, options.tag,
                                  "to rank " + std::to_string(dst));
  // A CUDA tensor is copied to the host now; the copy travels with the send.
  auto host = std::make_shared<Tensor>(on_host(tensor, true));
  p2p_->post_send(work, host, dst, options.tag, tensor.dtype(),
                  host->data_ptr(), host->nbytes(),
                  detail::deadline_after(resolve(options.timeout)));
  return work;
}

std::shared_ptr<Work> TcpBackend::do_recv(Tensor& tensor, int src,
                                          const RecvOptions& options) {
  auto work = point_to_point_work("recv", tensor, options.tag,
                                  src == kAnySource
                                      ? std::string("from any rank")
                                      : "from rank " + std::to_string(src));
  // A CUDA tensor receives into a host copy, copied over when it arrives.
  auto host = std::make_shared<Tensor>(on_host(tensor, false));
  std::function<void()> copy_back;
  if (!tensor.device().is_cpu()) {
    copy_back = [tensor, host]() mutable { tensor.copy_(*host); };
  }
  p2p_->post_recv(work, host, src, options.tag, tensor.dtype(),
                  host->data_ptr(), host->nbytes(),
                  detail::deadline_after(resolve(options.timeout)),
                  std::move(copy_back));
  return work;
}

}  // namespace comm
