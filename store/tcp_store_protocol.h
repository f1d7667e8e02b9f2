// The TCPStore wire protocol, shared by the client, the libuv server and the
// fuzzer. Pure functions over bytes: no sockets, no exceptions, no crypto
// (store/tcp_store_auth.h computes the proofs these frames carry).
//
// Every message travels in a frame: an 8-byte little-endian payload length,
// then the payload. A connection starts with a hello frame from the client:
//   magic (u32) | protocol version (u16) | body (u32 length + bytes)
// where version 2's body is
//   has token (u8, 0 or 1) | client nonce (32 random bytes)
// The server answers with a welcome frame:
//   magic (u32) | server protocol version (u16) | HelloStatus (u8)
//             [| data (u32 length + bytes)]
// Every version's hello and welcome begin with magic and version, and a
// version mismatch is answered with the 7-byte welcome every version reads,
// so a peer of another version gets a clear error instead of garbage.
//
// Without a token on either side the welcome is kOk and the connection is
// open. When only one side has a token the welcome says which
// (kTokenRequired, kTokenNotExpected) and the server closes. When both have
// one, authentication is challenge-response, and the token never crosses the
// wire:
//   server: welcome kChallenge, data = server nonce (32 random bytes)
//   client: proof frame: magic (u32) | HMAC (u32 length + 32 bytes) over
//           both nonces, under a key derived from the token
//   server: welcome kOk, data = its own HMAC over both nonces (so the client
//           knows the server has the token too), or kBadToken and closes.
// Both nonces are fresh per connection, so a recorded proof is worthless on
// another connection.
//
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

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"

namespace comm::tcp_store_protocol {

inline constexpr std::uint32_t kMagic = 0x54534d43;  // "CMST" on the wire
// 1: the token in clear in the hello. 2: challenge-response.
inline constexpr std::uint16_t kVersion = 2;
// The longest token a server or client accepts from its configuration.
inline constexpr std::size_t kMaxTokenSize = 4096;
inline constexpr std::size_t kNonceSize = 32;
inline constexpr std::size_t kProofSize = 32;  // HMAC-SHA256
// The longest hello body any version sends (version 1's was a token).
inline constexpr std::size_t kMaxHelloBody = kMaxTokenSize;
inline constexpr std::size_t kLengthSize = 8;  // the frame's length prefix
// The largest payload either side accepts: one maximal value with its key
// and framing. A length beyond it closes the connection before anything is
// allocated for it.
inline constexpr std::size_t kMaxPayload =
    Store::kMaxValueSize + Store::kMaxKeySize + 4096;
// The largest hello payload: magic, version and a maximal body. The proof
// frame is smaller.
inline constexpr std::size_t kMaxHelloPayload = 4 + 2 + 4 + kMaxHelloBody;

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
  kOk = 0,                // data: the server's proof after a challenge
  kVersionMismatch = 1,   // always the 7-byte welcome
  kBadToken = 2,          // the client's proof is wrong: tokens differ
  kChallenge = 3,         // data: the server's nonce; send a Proof
  kTokenRequired = 4,     // the server has a token, the client none
  kTokenNotExpected = 5,  // the client has a token, the server none
};
inline constexpr std::uint8_t kLastHelloStatus = 5;

using Nonce = std::array<std::uint8_t, kNonceSize>;
using ProofMac = std::array<std::uint8_t, kProofSize>;

struct Hello {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  // Decoded only when version is kVersion; another version's body is left
  // to the version mismatch it causes.
  bool has_token = false;
  Nonce client_nonce{};
};

struct Welcome {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  HelloStatus status = HelloStatus::kOk;
  // The server's nonce (kChallenge) or proof (kOk after a challenge); empty
  // otherwise, and then not encoded at all.
  Bytes data;
};

// The client's answer to a challenge.
struct Proof {
  std::uint32_t magic = kMagic;
  ProofMac mac{};
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
Bytes encode_proof(const Proof& proof);
Bytes encode_message(const Message& message);

// Decoders take one payload (no length prefix). They return an empty string
// on success, else what is wrong with the bytes.
std::string decode_hello(const std::uint8_t* data, std::size_t size,
                         Hello* hello);
// Checks the data's size for the status: a nonce with kChallenge, empty or
// a proof with kOk, empty with the others.
std::string decode_welcome(const std::uint8_t* data, std::size_t size,
                           Welcome* welcome);
std::string decode_proof(const std::uint8_t* data, std::size_t size,
                         Proof* proof);
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
