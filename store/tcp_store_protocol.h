// The TCPStore wire protocol, shared by the client, the libuv server and the
// fuzzer. Pure functions over bytes: no sockets, no exceptions.
//
// Every message travels in a frame: an 8-byte little-endian payload length,
// then the payload. A connection starts with a hello frame from the client:
//   magic (u32) | protocol version (u16) | token (u32 length + bytes)
// answered by a welcome frame from the server:
//   magic (u32) | server protocol version (u16) | HelloStatus (u8)
// After a kOk welcome, each request frame is a Message whose code is an Op,
// and each response a Message whose code is a Status:
//   code (u8) | key count (u32) | keys (u32 length + bytes each)
//             | value count (u32) | values (u32 length + bytes each)
//             | number (i64)
// All integers are little-endian. Requests are answered in order, except
// kSet, which is not answered at all (as in c10d, a set costs the client one
// send; the connection's ordering makes it visible to the client's next
// request). The blocking ones (kGet, kWait) are answered when their keys are
// all set, or with kCanceled after the client sends kCancel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"

namespace comm::tcp_store_protocol {

inline constexpr std::uint32_t kMagic = 0x54534d43;  // "CMST" on the wire
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kMaxTokenSize = 4096;
inline constexpr std::size_t kLengthSize = 8;  // the frame's length prefix
// The largest payload either side accepts: one maximal value with its key
// and framing. A length beyond it closes the connection before anything is
// allocated for it.
inline constexpr std::size_t kMaxPayload =
    Store::kMaxValueSize + Store::kMaxKeySize + 4096;
// The largest hello payload: magic, version and a maximal token.
inline constexpr std::size_t kMaxHelloPayload = 4 + 2 + 4 + kMaxTokenSize;

enum class Op : std::uint8_t {
  kSet = 1,         // keys[0], values[0]; no answer
  kGet = 2,         // keys (one or more); blocks; answers values
  kAdd = 3,         // keys[0], number = delta; answers number
  kCompareSet = 4,  // keys[0], values[0] expected, values[1] desired
  kWait = 5,        // keys (one or more); blocks
  kCheck = 6,       // keys; answers number 1 or 0
  kDelete = 7,      // keys[0]; answers number 1 or 0
  kNumKeys = 8,     // answers number
  kMultiSet = 9,    // keys and values, equal counts
  kAppend = 10,     // keys[0], values[0]
  kCancel = 11,     // cancels this connection's pending kGet or kWait
};

enum class Status : std::uint8_t {
  kOk = 0,
  kError = 1,     // values[0] is the message; the request had no effect
  kCanceled = 2,  // the answer to kCancel; keys: those still missing
};

enum class HelloStatus : std::uint8_t {
  kOk = 0,
  kVersionMismatch = 1,
  kBadToken = 2,
};

struct Hello {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  std::string token;
};

struct Welcome {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  HelloStatus status = HelloStatus::kOk;
};

struct Message {
  std::uint8_t code = 0;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  std::int64_t number = 0;
};

// Encoders return a whole frame (length prefix included).
Bytes encode_hello(const Hello& hello);
Bytes encode_welcome(const Welcome& welcome);
Bytes encode_message(const Message& message);

// Decoders take one payload (no length prefix). They return an empty string
// on success, else what is wrong with the bytes.
std::string decode_hello(const std::uint8_t* data, std::size_t size,
                         Hello* hello);
std::string decode_welcome(const std::uint8_t* data, std::size_t size,
                           Welcome* welcome);
std::string decode_message(const std::uint8_t* data, std::size_t size,
                           Message* message);

// Checks that a decoded request has the keys and values its op needs and
// that they are within the store's limits; empty string when it does.
std::string validate_request(const Message& request);

// The size of an encoded message's payload, to refuse oversized requests
// before building them.
std::size_t encoded_size(const Message& message);

// Accumulates bytes from a stream and cuts them into frames.
class FrameReader {
 public:
  enum class State { kNeedMore, kFrame, kTooLarge };

  void append(const std::uint8_t* data, std::size_t size);
  // kFrame: the next payload is [payload(), payload() + payload_size()), valid
  // until the next call; kTooLarge: the announced length exceeds `limit`
  // (at most kMaxPayload) and the stream cannot be resynchronised. Nothing is
  // allocated for an announced length before it is checked.
  State next(std::size_t limit = kMaxPayload);
  const std::uint8_t* payload() const {
    return buffer_.data() + start_ + kLengthSize;
  }
  std::size_t payload_size() const { return payload_size_; }

 private:
  Bytes buffer_;
  std::size_t start_ = 0;         // where the next unread frame begins
  std::size_t payload_size_ = 0;  // of the frame handed out last
  bool handed_out_ = false;       // a frame at start_ was handed out
};

}  // namespace comm::tcp_store_protocol
