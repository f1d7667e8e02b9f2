#include "store/tcp_store_protocol.h"

#include <algorithm>
#include <cstring>

namespace comm::tcp_store_protocol {
namespace {

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(v); }
  void u16(std::uint16_t v) { little_endian(v, 2); }
  void u32(std::uint32_t v) { little_endian(v, 4); }
  void i64(std::int64_t v) { little_endian(static_cast<std::uint64_t>(v), 8); }
  void bytes(const void* data, std::size_t size) {
    const auto* start = static_cast<const std::uint8_t*>(data);
    out_.insert(out_.end(), start, start + size);
  }
  void blob(const void* data, std::size_t size) {
    u32(static_cast<std::uint32_t>(size));
    bytes(data, size);
  }
  // Prefixes the payload written so far with its length.
  Bytes frame() {
    Bytes framed(kLengthSize);
    const std::uint64_t size = out_.size();
    for (std::size_t i = 0; i < kLengthSize; ++i) {
      framed[i] = static_cast<std::uint8_t>(size >> (8 * i));
    }
    framed.insert(framed.end(), out_.begin(), out_.end());
    return framed;
  }

 private:
  void little_endian(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i)
      out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  Bytes out_;
};

// Reads fields from a payload; once a read runs past the end, every later
// read fails too and ok() is false.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size)
      : data_(data), size_(size) {}

  std::uint64_t little_endian(int bytes) {
    if (!take(static_cast<std::size_t>(bytes))) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= static_cast<std::uint64_t>(data_[pos_ - bytes + i]) << (8 * i);
    }
    return v;
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(little_endian(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(little_endian(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(little_endian(4)); }
  std::int64_t i64() { return static_cast<std::int64_t>(little_endian(8)); }
  // A length-prefixed blob of at most `limit` bytes.
  bool blob(std::size_t limit, const std::uint8_t** start, std::size_t* size) {
    const std::uint32_t length = u32();
    if (!ok_ || length > limit || !take(length)) {
      ok_ = false;
      return false;
    }
    *start = data_ + pos_ - length;
    *size = length;
    return true;
  }
  // The number of elements a count field may announce: each needs at least
  // its 4-byte length, so a count beyond what is left is a lie.
  bool count(std::uint32_t* n) {
    *n = u32();
    if (ok_ && *n > (size_ - pos_) / 4) ok_ = false;
    return ok_;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == size_; }

 private:
  bool take(std::size_t n) {
    if (!ok_ || n > size_ - pos_) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

Bytes encode_hello(const Hello& hello) {
  Writer w;
  w.u32(hello.magic);
  w.u16(hello.version);
  w.u32(static_cast<std::uint32_t>(1 + kNonceSize));
  w.u8(hello.has_token ? 1 : 0);
  w.bytes(hello.client_nonce.data(), hello.client_nonce.size());
  return w.frame();
}

Bytes encode_welcome(const Welcome& welcome) {
  Writer w;
  w.u32(welcome.magic);
  w.u16(welcome.version);
  w.u8(static_cast<std::uint8_t>(welcome.status));
  if (!welcome.data.empty()) w.blob(welcome.data.data(), welcome.data.size());
  return w.frame();
}

Bytes encode_proof(const Proof& proof) {
  Writer w;
  w.u32(proof.magic);
  w.blob(proof.mac.data(), proof.mac.size());
  return w.frame();
}

Bytes encode_message(const Message& message) {
  Writer w;
  w.u8(message.code);
  w.u32(static_cast<std::uint32_t>(message.keys.size()));
  for (const std::string& key : message.keys) w.blob(key.data(), key.size());
  w.u32(static_cast<std::uint32_t>(message.values.size()));
  for (const Bytes& value : message.values) w.blob(value.data(), value.size());
  w.i64(message.number);
  return w.frame();
}

std::size_t encoded_size(const Message& message) {
  std::size_t size = 1 + 4 + 4 + 8;
  for (const std::string& key : message.keys) size += 4 + key.size();
  for (const Bytes& value : message.values) size += 4 + value.size();
  return size;
}

std::string decode_hello(const std::uint8_t* data, std::size_t size,
                         Hello* hello) {
  Reader r(data, size);
  hello->magic = r.u32();
  if (!r.ok() || hello->magic != kMagic)
    return "not a libcomm TCPStore client (bad magic)";
  hello->version = r.u16();
  const std::uint8_t* body = nullptr;
  std::size_t body_size = 0;
  if (!r.blob(kMaxHelloBody, &body, &body_size) || !r.at_end()) {
    return "malformed hello";
  }
  if (hello->version != kVersion) return {};
  if (body_size != 1 + kNonceSize || body[0] > 1) {
    return "malformed hello: its body is not a token flag and a nonce";
  }
  hello->has_token = body[0] == 1;
  std::memcpy(hello->client_nonce.data(), body + 1, kNonceSize);
  return {};
}

std::string decode_welcome(const std::uint8_t* data, std::size_t size,
                           Welcome* welcome) {
  Reader r(data, size);
  welcome->magic = r.u32();
  if (!r.ok() || welcome->magic != kMagic)
    return "not a libcomm TCPStore server (bad magic)";
  welcome->version = r.u16();
  const std::uint8_t status = r.u8();
  if (!r.ok() || status > kLastHelloStatus) return "malformed welcome";
  welcome->status = static_cast<HelloStatus>(status);
  welcome->data.clear();
  if (!r.at_end()) {
    const std::uint8_t* bytes = nullptr;
    std::size_t bytes_size = 0;
    if (!r.blob(kNonceSize + kProofSize, &bytes, &bytes_size) || !r.at_end() ||
        bytes_size == 0) {
      return "malformed welcome";
    }
    welcome->data.assign(bytes, bytes + bytes_size);
  }
  // A welcome of another version is read only for its status and version.
  if (welcome->version != kVersion) return {};
  const std::size_t n = welcome->data.size();
  const bool fits = welcome->status == HelloStatus::kChallenge ? n == kNonceSize
                    : welcome->status == HelloStatus::kOk
                        ? n == 0 || n == kProofSize
                        : n == 0;
  if (!fits) return "malformed welcome: data of the wrong size for its status";
  return {};
}

std::string decode_proof(const std::uint8_t* data, std::size_t size,
                         Proof* proof) {
  Reader r(data, size);
  proof->magic = r.u32();
  if (!r.ok() || proof->magic != kMagic)
    return "not a libcomm TCPStore proof (bad magic)";
  const std::uint8_t* mac = nullptr;
  std::size_t mac_size = 0;
  if (!r.blob(kProofSize, &mac, &mac_size) || !r.at_end() ||
      mac_size != kProofSize) {
    return "malformed proof";
  }
  std::memcpy(proof->mac.data(), mac, kProofSize);
  return {};
}

std::string decode_message(const std::uint8_t* data, std::size_t size,
                           Message* message) {
  Reader r(data, size);
  message->code = r.u8();
  std::uint32_t key_count = 0;
  if (!r.count(&key_count)) return "malformed message: bad key count";
  message->keys.clear();
  message->keys.reserve(key_count);
  for (std::uint32_t i = 0; i < key_count; ++i) {
    const std::uint8_t* key = nullptr;
    std::size_t key_size = 0;
    if (!r.blob(Store::kMaxKeySize, &key, &key_size)) {
      return "malformed message: key " + std::to_string(i) +
             " is truncated or longer than " +
             std::to_string(Store::kMaxKeySize) + " bytes";
    }
    message->keys.emplace_back(reinterpret_cast<const char*>(key), key_size);
  }
  std::uint32_t value_count = 0;
  if (!r.count(&value_count)) return "malformed message: bad value count";
  message->values.clear();
  message->values.reserve(value_count);
  for (std::uint32_t i = 0; i < value_count; ++i) {
    const std::uint8_t* value = nullptr;
    std::size_t value_size = 0;
    if (!r.blob(Store::kMaxValueSize, &value, &value_size)) {
      return "malformed message: value " + std::to_string(i) +
             " is truncated or larger than " +
             std::to_string(Store::kMaxValueSize) + " bytes";
    }
    message->values.emplace_back(value, value + value_size);
  }
  message->number = r.i64();
  if (!r.ok()) return "malformed message: truncated";
  if (!r.at_end()) return "malformed message: trailing bytes";
  return {};
}

std::string validate_request(const Message& request) {
  const std::size_t keys = request.keys.size();
  const std::size_t values = request.values.size();
  auto expect = [&](bool ok, const char* shape) -> std::string {
    if (ok) return {};
    return "op " + std::to_string(request.code) + " needs " + shape + ", got " +
           std::to_string(keys) + " keys and " + std::to_string(values) +
           " values";
  };
  switch (static_cast<Op>(request.code)) {
    case Op::kSet:
    case Op::kAppend:
      return expect(keys == 1 && values == 1, "1 key and 1 value");
    case Op::kGet:
    case Op::kWait:
    case Op::kCheck:
      return expect(keys >= 1 && values == 0, "keys and no values");
    case Op::kAdd:
    case Op::kDelete: return expect(keys == 1 && values == 0, "1 key");
    case Op::kCompareSet:
      return expect(keys == 1 && values == 2, "1 key and 2 values");
    case Op::kNumKeys:
    case Op::kCancel: return expect(keys == 0 && values == 0, "nothing");
    case Op::kMultiSet: return expect(keys == values, "as many values as keys");
  }
  return "unknown op " + std::to_string(request.code);
}

void FrameReader::append(const std::uint8_t* data, std::size_t size) {
  buffer_.insert(buffer_.end(), data, data + size);
}

FrameReader::State FrameReader::next(std::size_t limit) {
  if (handed_out_) {
    start_ += kLengthSize + payload_size_;
    handed_out_ = false;
  }
  // Drop consumed bytes once they are the larger part of the buffer, so
  // that the buffer stays bounded without moving bytes on every frame.
  if (start_ > 0 && start_ * 2 >= buffer_.size()) {
    buffer_.erase(buffer_.begin(),
                  buffer_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  if (buffer_.size() - start_ < kLengthSize) return State::kNeedMore;
  std::uint64_t length = 0;
  for (std::size_t i = 0; i < kLengthSize; ++i) {
    length |= static_cast<std::uint64_t>(buffer_[start_ + i]) << (8 * i);
  }
  if (length > std::min(limit, kMaxPayload)) return State::kTooLarge;
  if (buffer_.size() - start_ < kLengthSize + length) return State::kNeedMore;
  payload_size_ = length;
  handed_out_ = true;
  return State::kFrame;
}

}  // namespace comm::tcp_store_protocol
