#include "backends/tcp/control_message.h"

#include <algorithm>
#include <cstring>

namespace comm::tcp {
namespace {

// Appends values to a message; little-endian hosts only (x86-64, aarch64),
// as for MessageHeader.
class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}
  template <typename T>
  void put(T value) {
    const std::size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  void put_bytes(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::uint8_t*>(data);
    out_.insert(out_.end(), bytes, bytes + size);
  }

 private:
  std::vector<std::uint8_t>& out_;
};

// Takes values from a message, refusing to read past its end.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size)
      : data_(data), left_(size) {}
  template <typename T>
  bool take(T& value) {
    if (left_ < sizeof(T)) return false;
    std::memcpy(&value, data_, sizeof(T));
    data_ += sizeof(T);
    left_ -= sizeof(T);
    return true;
  }
  bool take_bytes(void* out, std::size_t size) {
    if (left_ < size) return false;
    if (size > 0) std::memcpy(out, data_, size);
    data_ += size;
    left_ -= size;
    return true;
  }
  std::size_t left() const { return left_; }

 private:
  const std::uint8_t* data_;
  std::size_t left_;
};

// The body's fixed fields before the rank list: the call (collective,
// dtype, op, reserved byte, sequence, count, root), the error kind, the
// answer's state, two reserved bytes, the rank blamed and the length of the
// rank list.
constexpr std::size_t kFixedBody = 4 + 8 + 8 + 4 + 1 + 3 + 4 + 4;

}  // namespace

std::vector<std::uint8_t> ControlMessage::encode() const {
  if (kind == ControlKind::kHeartbeat) {
    std::vector<std::uint8_t> bytes;
    bytes.reserve(kPrefixSize);
    Writer out(bytes);
    out.put<std::uint32_t>(kMagic);
    out.put<std::uint8_t>(kVersion);
    out.put<std::uint8_t>(static_cast<std::uint8_t>(kind));
    out.put<std::uint16_t>(0);
    out.put<std::uint32_t>(0);
    return bytes;
  }
  // The rank list, then the text, are cut so that the body never exceeds
  // what a reader accepts.
  constexpr std::size_t kRoom = kMaxBodyBytes - kFixedBody - 4;
  const std::size_t rank_count = std::min(waiting_for.size(), kRoom / 4);
  const std::size_t ranks = rank_count * 4;
  const std::size_t text_bytes = std::min(text.size(), kRoom - ranks);
  const std::size_t body = kFixedBody + ranks + 4 + text_bytes;
  std::vector<std::uint8_t> bytes;
  bytes.reserve(kPrefixSize + body);
  Writer out(bytes);
  out.put<std::uint32_t>(kMagic);
  out.put<std::uint8_t>(kVersion);
  out.put<std::uint8_t>(static_cast<std::uint8_t>(kind));
  out.put<std::uint16_t>(0);
  out.put<std::uint32_t>(static_cast<std::uint32_t>(body));
  out.put<std::uint8_t>(static_cast<std::uint8_t>(call.collective));
  out.put<std::uint8_t>(static_cast<std::uint8_t>(call.dtype));
  out.put<std::uint8_t>(static_cast<std::uint8_t>(call.op));
  out.put<std::uint8_t>(0);
  out.put<std::uint64_t>(call.sequence);
  out.put<std::int64_t>(call.count);
  out.put<std::int32_t>(call.root);
  out.put<std::uint8_t>(static_cast<std::uint8_t>(error));
  out.put<std::uint8_t>(static_cast<std::uint8_t>(state));
  out.put<std::uint16_t>(0);
  out.put<std::int32_t>(blamed);
  out.put<std::uint32_t>(static_cast<std::uint32_t>(rank_count));
  for (std::size_t i = 0; i < rank_count; ++i) {
    out.put<std::int32_t>(waiting_for[i]);
  }
  out.put<std::uint32_t>(static_cast<std::uint32_t>(text_bytes));
  out.put_bytes(text.data(), text_bytes);
  return bytes;
}

std::optional<std::size_t> ControlMessage::body_size(
    const std::uint8_t* prefix) {
  Reader in(prefix, kPrefixSize);
  std::uint32_t magic = 0;
  std::uint8_t version = 0;
  std::uint8_t kind = 0;
  std::uint16_t reserved = 0;
  std::uint32_t body = 0;
  in.take(magic);
  in.take(version);
  in.take(kind);
  in.take(reserved);
  in.take(body);
  if (magic != kMagic || version != kVersion || body > kMaxBodyBytes) {
    return std::nullopt;
  }
  return body;
}

std::optional<ControlMessage> ControlMessage::decode(const std::uint8_t* bytes,
                                                     std::size_t size) {
  if (size < kPrefixSize) return std::nullopt;
  const std::optional<std::size_t> body = body_size(bytes);
  if (!body || *body != size - kPrefixSize) return std::nullopt;
  ControlMessage message;
  std::uint8_t kind = bytes[5];
  if (kind < static_cast<std::uint8_t>(ControlKind::kAbort) ||
      kind > static_cast<std::uint8_t>(ControlKind::kLeaving)) {
    return std::nullopt;
  }
  message.kind = static_cast<ControlKind>(kind);
  if (message.kind == ControlKind::kHeartbeat) {
    if (*body != 0) return std::nullopt;
    return message;
  }

  Reader in(bytes + kPrefixSize, *body);
  std::uint8_t collective = 0, dtype = 0, op = 0, error = 0, pad8 = 0,
               state = 0;
  std::uint16_t pad16 = 0;
  std::uint32_t ranks = 0;
  if (!in.take(collective) || !in.take(dtype) || !in.take(op) ||
      !in.take(pad8) || !in.take(message.call.sequence) ||
      !in.take(message.call.count) || !in.take(message.call.root) ||
      !in.take(error) || !in.take(state) || !in.take(pad16) ||
      !in.take(message.blamed) || !in.take(ranks)) {
    return std::nullopt;
  }
  if (collective < static_cast<std::uint8_t>(Collective::kBroadcast) ||
      collective > static_cast<std::uint8_t>(Collective::kSend) ||
      dtype > static_cast<std::uint8_t>(DType::kBool) ||
      op > static_cast<std::uint8_t>(ReduceOp::kBxor) ||
      error > static_cast<std::uint8_t>(ErrorKind::kUnsupported) ||
      state > static_cast<std::uint8_t>(CallState::kForgotten)) {
    return std::nullopt;
  }
  message.call.collective = static_cast<Collective>(collective);
  message.call.dtype = static_cast<DType>(dtype);
  message.call.op = static_cast<ReduceOp>(op);
  message.error = static_cast<ErrorKind>(error);
  message.state = static_cast<CallState>(state);
  // Checked before reserving, so that a forged count allocates nothing.
  if (ranks > in.left() / 4) return std::nullopt;
  message.waiting_for.reserve(ranks);
  for (std::uint32_t i = 0; i < ranks; ++i) {
    std::int32_t rank = 0;
    in.take(rank);
    message.waiting_for.push_back(rank);
  }
  std::uint32_t text = 0;
  if (!in.take(text) || text != in.left()) return std::nullopt;
  message.text.resize(text);
  in.take_bytes(message.text.data(), text);
  return message;
}

}  // namespace comm::tcp
