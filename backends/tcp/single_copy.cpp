#include "backends/tcp/single_copy.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "backends/tcp/exchange.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"
#include "libcomm/optional_int_param.h"
#include "libcomm/reduce_kernels.h"

namespace comm::tcp::algorithms {
namespace {

const OptionalIntParam kDirectThresholdBytes{
    "COMM_SHM_DIRECT_THRESHOLD_BYTES",
    "1048576 where the kernel's copy keeps up (COMM_SHM_KERNEL_COPY), else "
    "67108864",
    1, std::numeric_limits<std::int64_t>::max(),
    "the smallest all_reduce, all_gather, reduce_scatter or all_to_all of "
    "three ranks or more whose ranks, all on one host, read each other's "
    "buffers directly instead of through the shared-memory rings"};
const IntParam kDirectFromRootThresholdBytes{
    "COMM_SHM_DIRECT_FROM_ROOT_THRESHOLD_BYTES", 32 << 20, 1,
    std::numeric_limits<std::int64_t>::max(),
    "the smallest broadcast or scatter of three ranks or more whose "
    "ranks, all on one host, read the root's buffer directly"};
const IntParam kDirectToRootThresholdBytes{
    "COMM_SHM_DIRECT_TO_ROOT_THRESHOLD_BYTES", std::int64_t{1} << 30, 1,
    std::numeric_limits<std::int64_t>::max(),
    "the smallest gather or reduce whose root, with every rank on one host, "
    "reads the others' buffers directly"};
const IntParam kDirectAtTwoRanksThresholdBytes{
    "COMM_SHM_DIRECT_AT_TWO_RANKS_THRESHOLD_BYTES", 1 << 20, 1,
    std::numeric_limits<std::int64_t>::max(),
    "the smallest all_gather or all_to_all of two ranks on one host that "
    "reads the peer's buffer directly, where the kernel's copy keeps up "
    "(COMM_SHM_KERNEL_COPY)"};
const OptionalIntParam kDirectSharedThresholdBytes{
    "COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES",
    "32768, and 1048576 for gather and reduce of three ranks or more", 1,
    std::numeric_limits<std::int64_t>::max(),
    "the smallest collective of ranks all on one host, every one of them "
    "passing shared host memory (allocate_shared_host, comm_mem_alloc), "
    "whose ranks read each other's buffers directly; gather and scatter "
    "count one part"};
// Unless COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES is set: the root of a
// gather or reduce reads or reduces every rank's buffer in turn, where the
// rings' tree works on several cores at once, and with inputs written
// before each call the tree was faster below this from three ranks on
// (bench/README.md, "Shared host memory").
constexpr std::size_t kSharedToRootThresholdBytes = 1 << 20;
constexpr std::size_t kSharedThresholdBytes = 32 << 10;
const IntParam kDirectFromRootAtTwoRanksThresholdBytes{
    "COMM_SHM_DIRECT_FROM_ROOT_AT_TWO_RANKS_THRESHOLD_BYTES", 256 << 10, 1,
    std::numeric_limits<std::int64_t>::max(),
    "the smallest scatter of two ranks on one host whose other rank reads "
    "the root's buffer directly, where the kernel's copy keeps up "
    "(COMM_SHM_KERNEL_COPY)"};

}  // namespace

Buffers buffers_of(
    std::initializer_list<std::pair<const void*, std::size_t>> buffers) {
  for (const auto& [data, bytes] : buffers) {
    if (!find_shared_host(data, bytes)) return Buffers::kOrdinary;
  }
  return Buffers::kShared;
}

std::size_t direct_threshold_bytes(const PeerMemory& memory, DirectKind kind,
                                   int size, AtTwoRanks at_two_ranks,
                                   Buffers buffers) {
  if (buffers == Buffers::kShared) {
    if (const auto configured = kDirectSharedThresholdBytes.get()) {
      return static_cast<std::size_t>(*configured);
    }
    return kind == DirectKind::kToRoot && size > 2 ? kSharedToRootThresholdBytes
                                                   : kSharedThresholdBytes;
  }
  if (size == 2 && at_two_ranks == AtTwoRanks::kReadWhereKernelCopyKeepsUp) {
    const IntParam& threshold = kind == DirectKind::kFromRoot
                                    ? kDirectFromRootAtTwoRanksThresholdBytes
                                    : kDirectAtTwoRanksThresholdBytes;
    return static_cast<std::size_t>(threshold.get());
  }
  switch (kind) {
    case DirectKind::kAmongAll:
      if (const auto configured = kDirectThresholdBytes.get()) {
        return static_cast<std::size_t>(*configured);
      }
      return memory.kernel_copy_keeps_up() ? std::size_t{1} << 20
                                           : std::size_t{64} << 20;
    case DirectKind::kFromRoot:
      return static_cast<std::size_t>(kDirectFromRootThresholdBytes.get());
    case DirectKind::kToRoot:
      return static_cast<std::size_t>(kDirectToRootThresholdBytes.get());
  }
  return std::numeric_limits<std::size_t>::max();
}

PeerMemory* readable_memory(CollectiveTransport& ctx, AtTwoRanks at_two_ranks,
                            Buffers buffers) {
  if (ctx.size() < 2) return nullptr;
  PeerMemory* memory = ctx.peer_memory();
  if (ctx.size() > 2 || memory == nullptr || buffers == Buffers::kShared) {
    return memory;
  }
  switch (at_two_ranks) {
    case AtTwoRanks::kReadDirectly: return memory;
    case AtTwoRanks::kKeepRings: return nullptr;
    case AtTwoRanks::kReadWhereKernelCopyKeepsUp:
      return memory->kernel_copy_keeps_up() ? memory : nullptr;
  }
  return nullptr;
}

PeerMemory* direct_memory(CollectiveTransport& ctx, std::size_t bytes,
                          DirectKind kind, AtTwoRanks at_two_ranks,
                          Buffers buffers) {
  PeerMemory* memory = readable_memory(ctx, at_two_ranks, buffers);
  if (memory == nullptr ||
      bytes < direct_threshold_bytes(*memory, kind, ctx.size(), at_two_ranks,
                                     buffers)) {
    return nullptr;
  }
  return memory;
}

Region region_of(const void* data, std::size_t bytes) {
  Region region;
  region.address = reinterpret_cast<std::uintptr_t>(data);
  region.bytes = bytes;
  if (const auto block = find_shared_host(data, bytes)) {
    region.block = *block;
    region.blocks_freed = shared_host_blocks_freed();
  }
  return region;
}

Region part_from(Region region, std::uint64_t offset) {
  region.address += offset;
  region.bytes -= std::min(offset, region.bytes);
  return region;
}

std::vector<int> peers(const CollectiveTransport& ctx) {
  std::vector<int> others;
  for (int k = 1; k < ctx.size(); ++k) {
    others.push_back((ctx.rank() + k) % ctx.size());
  }
  return others;
}

std::vector<std::vector<Region>> trade_regions(
    CollectiveTransport& ctx, const std::vector<int>& to,
    const std::vector<std::vector<Region>>& outgoing,
    const std::vector<int>& from, std::size_t each) {
  std::vector<std::vector<Region>> incoming(
      static_cast<std::size_t>(ctx.size()));
  CollectiveStep& step = ctx.step();
  for (int peer : to) {
    const std::vector<Region>& message = outgoing[peer];
    step.send_address(peer, message.data(), message.size() * sizeof(Region));
  }
  for (int peer : from) {
    incoming[peer].resize(each);
    step.recv_address(peer, incoming[peer].data(), each * sizeof(Region));
  }
  step.run();
  return incoming;
}

void check_bytes(const CollectiveTransport& ctx, int peer,
                 const Region& offered, std::size_t expected) {
  if (offered.bytes == expected) return;
  throw MismatchError(
      "in " + ctx.describe() + ", rank " + std::to_string(peer) + " offers " +
      std::to_string(offered.bytes) + " bytes where rank " +
      std::to_string(ctx.rank()) + " expects " + std::to_string(expected) +
      "; check that the ranks' sizes agree");
}

void lend_to(CollectiveTransport& ctx, int reader, const Region& region) {
  std::vector<std::vector<Region>> outgoing(
      static_cast<std::size_t>(ctx.size()));
  outgoing[reader] = {region};
  trade_regions(ctx, {reader}, outgoing, {}, 0);
  signal(ctx, {}, {reader});
}

void signal(CollectiveTransport& ctx, const std::vector<int>& to,
            const std::vector<int>& from) {
  if (to.empty() && from.empty()) return;
  CollectiveStep& step = ctx.step();
  for (int peer : to) step.send(peer, nullptr, 0);
  for (int peer : from) step.recv(peer, nullptr, 0);
  step.run();
}

Segment segment_of(std::size_t count, int parts, int i) {
  const auto n = static_cast<std::size_t>(parts);
  const auto u = static_cast<std::size_t>(i);
  const std::size_t base = count / n;
  const std::size_t longer = count % n;
  return {u * base + std::min(u, longer),
          (u + 1) * base + std::min(u + 1, longer)};
}

void read_slices(PeerMemory& memory, const std::vector<int>& from,
                 const std::vector<Region>& buffers, std::uint8_t* data,
                 std::size_t count, int parts, std::size_t element) {
  for (int peer : from) {
    const Segment slice = segment_of(count, parts, peer);
    const std::size_t at = slice.begin * element;
    const std::size_t length = (slice.end - slice.begin) * element;
    if (length > 0) {
      memory.read(peer, buffers[static_cast<std::size_t>(peer)], at, data + at,
                  length);
    }
  }
}

void reduce_from_peers(CollectiveTransport& ctx, PeerMemory& memory,
                       const std::vector<Region>& operands,
                       const std::uint8_t* own, std::uint8_t* output,
                       std::size_t count, DType dtype, ReduceOp op) {
  const int rank = ctx.rank();
  const int size = ctx.size();
  if (count == 0) return;
  const std::size_t element = dtype_size(dtype);
  const std::size_t chunk = std::min(count, chunk_bytes() / element);
  // The running result of the chunk, and the operand read last.
  std::uint8_t* const running = memory.scratch(2 * chunk * element);
  std::uint8_t* const read = running + chunk * element;
  // Each peer's operand where this process maps it, read in place.
  std::vector<const std::uint8_t*> in_place(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p != rank) in_place[p] = memory.mapped(p, operands[p]);
  }
  for (std::size_t first = 0; first < count; first += chunk) {
    const std::size_t n = std::min(chunk, count - first);
    const std::size_t offset = first * element;
    // Rank p's operand for this chunk: this rank's where it lies, a peer's
    // read into `into`.
    auto operand = [&](int p, std::uint8_t* into) -> const std::uint8_t* {
      if (p == rank) return own + offset;
      if (in_place[p] != nullptr) return in_place[p] + offset;
      memory.read(p, operands[p], offset, into, n * element);
      return into;
    };
    // Reading the own operand before writing the output makes `own` ==
    // `output` safe: the last reduction reads this chunk of both operands
    // before it writes the chunk (reduce_pair_into allows dst == b).
    const std::uint8_t* so_far = operand(0, running);
    for (int p = 1; p < size; ++p) {
      const std::uint8_t* next = operand(p, read);
      std::uint8_t* target = p == size - 1 ? output + offset : running;
      reduce_pair_into(op, dtype, target, so_far, next, n);
      so_far = target;
    }
  }
}

}  // namespace comm::tcp::algorithms
