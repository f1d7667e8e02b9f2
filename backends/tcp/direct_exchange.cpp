// When all_gather, reduce_scatter and all_to_all exchange with every peer
// in one step instead of n - 1 ring or pairwise steps, or small ones in
// log2 n steps between pairs; the parts those steps gather.
#include <bit>
#include <limits>

#include "backends/tcp/algorithms.h"
#include "libcomm/int_param.h"

namespace comm::tcp::algorithms {
namespace {

const IntParam kDirectThresholdBytes{
    "COMM_TCP_DIRECT_THRESHOLD_BYTES", 65536, 0,
    std::numeric_limits<std::int64_t>::max(),
    "the most bytes a rank sends in an all_gather, reduce_scatter or "
    "all_to_all that exchanges with every peer in one step; larger ones run "
    "n - 1 ring or pairwise steps"};

}  // namespace

bool exchange_directly(const CollectiveTransport& ctx, std::size_t bytes_sent) {
  return ctx.size() > 2 &&
         bytes_sent <= static_cast<std::size_t>(kDirectThresholdBytes.get());
}

bool exchange_in_pairs(const CollectiveTransport& ctx) {
  return ctx.size() >= 4 &&
         std::has_single_bit(static_cast<unsigned>(ctx.size()));
}

void append_part(std::pmr::vector<CollectiveStep::Part>& parts,
                 std::uint8_t* data, std::size_t bytes) {
  if (!parts.empty() && parts.back().data + parts.back().bytes == data) {
    parts.back().bytes += bytes;
  } else {
    parts.push_back({data, bytes});
  }
}

}  // namespace comm::tcp::algorithms
