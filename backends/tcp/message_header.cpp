#include "backends/tcp/message_header.h"

#include <cstring>

namespace comm::tcp {
namespace {

template <typename T>
void put(std::uint8_t*& out, T value) {
  // Little-endian hosts only (x86-64, aarch64): the header is copied as is.
  std::memcpy(out, &value, sizeof(T));
  out += sizeof(T);
}

template <typename T>
T take(const std::uint8_t*& in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  in += sizeof(T);
  return value;
}

}  // namespace

const char* collective_name(Collective collective) {
  switch (collective) {
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kGather: return "gather";
    case Collective::kScatter: return "scatter";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
  }
  return "unknown";
}

std::string CallInfo::describe() const {
  std::string text = std::string(collective_name(collective)) + " #" +
                     std::to_string(sequence);
  if (collective == Collective::kBarrier) return text;
  text += std::string(" (") + dtype_name(dtype);
  // all_to_all's sizes may differ per rank; they are checked per message.
  if (collective != Collective::kAllToAll)
    text += " x " + std::to_string(count);
  if (collective == Collective::kReduce ||
      collective == Collective::kAllReduce ||
      collective == Collective::kReduceScatter) {
    text += std::string(", ") + reduce_op_name(op);
  }
  if (collective == Collective::kBroadcast ||
      collective == Collective::kReduce || collective == Collective::kGather ||
      collective == Collective::kScatter) {
    text += ", root " + std::to_string(root);
  }
  if (collective == Collective::kSend) text += ", tag " + std::to_string(root);
  return text + ")";
}

void MessageHeader::encode(std::uint8_t* out) const {
  std::uint8_t* const begin = out;
  put<std::uint32_t>(out, kMagic);
  put<std::uint8_t>(out, static_cast<std::uint8_t>(call.collective));
  put<std::uint8_t>(out, static_cast<std::uint8_t>(call.dtype));
  put<std::uint8_t>(out, static_cast<std::uint8_t>(call.op));
  put<std::uint8_t>(out, address ? 1 : 0);
  put<std::uint64_t>(out, call.sequence);
  put<std::int64_t>(out, call.count);
  put<std::int32_t>(out, call.root);
  put<std::uint32_t>(out, 0);
  put<std::uint64_t>(out, payload_bytes);
  // Zeros to the end of the cache line; decode does not read them.
  std::memset(out, 0, kWireSize - static_cast<std::size_t>(out - begin));
}

bool MessageHeader::decode(const std::uint8_t* in) {
  if (take<std::uint32_t>(in) != kMagic) return false;
  const auto collective = take<std::uint8_t>(in);
  const auto dtype = take<std::uint8_t>(in);
  const auto op = take<std::uint8_t>(in);
  const auto kind = take<std::uint8_t>(in);
  if (collective < 1 || kind > 1 ||
      collective > static_cast<std::uint8_t>(Collective::kSend) ||
      dtype > static_cast<std::uint8_t>(DType::kBool) ||
      op > static_cast<std::uint8_t>(ReduceOp::kBxor)) {
    return false;
  }
  call.collective = static_cast<Collective>(collective);
  call.dtype = static_cast<DType>(dtype);
  call.op = static_cast<ReduceOp>(op);
  address = kind == 1;
  call.sequence = take<std::uint64_t>(in);
  call.count = take<std::int64_t>(in);
  call.root = take<std::int32_t>(in);
  take<std::uint32_t>(in);
  payload_bytes = take<std::uint64_t>(in);
  return true;
}

}  // namespace comm::tcp
