// libFuzzer target for the TCPStore wire protocol's parsers, both ways.
//
// The first byte picks the chunk size in which the rest is fed to a
// FrameReader (as TCP may deliver it); the second picks the direction:
// even, the bytes a client sends to the server (a hello, a proof when the
// hello says it has a token, then requests), each frame read under the
// server's limit for its state (a hello-sized frame until the handshake is
// done); odd, the bytes a server sends to a client (welcomes, which may be a
// challenge, then responses). Properties checked besides memory safety: a
// frame never exceeds the limit it was read under, and whatever decodes
// re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "store/tcp_store_protocol.h"

namespace proto = comm::tcp_store_protocol;

namespace {

void expect_same(const comm::Bytes& again, const proto::FrameReader& reader) {
  if (again.size() != proto::kLengthSize + reader.payload_size() ||
      std::memcmp(again.data() + proto::kLengthSize, reader.payload(),
                  reader.payload_size()) != 0) {
    std::abort();
  }
}

enum class Stage { kHello, kProof, kWelcome, kMessages };

// Handles one frame; false when the peer would close the connection here.
bool handle(Stage& stage, bool from_client, const proto::FrameReader& reader) {
  const std::uint8_t* payload = reader.payload();
  const std::size_t size = reader.payload_size();
  switch (stage) {
    case Stage::kHello: {
      proto::Hello hello;
      if (!proto::decode_hello(payload, size, &hello).empty()) return false;
      // Another version's body is not decoded; the server refuses it.
      if (hello.version != proto::kVersion) return false;
      expect_same(proto::encode_hello(hello), reader);
      stage = hello.has_token ? Stage::kProof : Stage::kMessages;
      return true;
    }
    case Stage::kProof: {
      proto::Proof proof;
      if (!proto::decode_proof(payload, size, &proof).empty()) return false;
      expect_same(proto::encode_proof(proof), reader);
      stage = Stage::kMessages;
      return true;
    }
    case Stage::kWelcome: {
      proto::Welcome welcome;
      if (!proto::decode_welcome(payload, size, &welcome).empty()) return false;
      if (welcome.version != proto::kVersion) return false;
      expect_same(proto::encode_welcome(welcome), reader);
      if (welcome.status == proto::HelloStatus::kChallenge) return true;
      if (welcome.status != proto::HelloStatus::kOk) return false;
      stage = Stage::kMessages;
      return true;
    }
    case Stage::kMessages: {
      proto::Message message;
      if (!proto::decode_message(payload, size, &message).empty()) return false;
      if (from_client) (void)proto::validate_request(message);
      expect_same(proto::encode_message(message), reader);
      if (proto::encoded_size(message) != size) std::abort();
      return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 2) return 0;
  const std::size_t chunk = 1 + data[0] % 64;
  const bool from_client = data[1] % 2 == 0;
  data += 2;
  size -= 2;
  proto::FrameReader reader;
  Stage stage = from_client ? Stage::kHello : Stage::kWelcome;
  for (std::size_t offset = 0; offset < size; offset += chunk) {
    reader.append(data + offset, std::min(chunk, size - offset));
    // Each frame consumes at least its length prefix, so this ends.
    while (true) {
      // The server's limit before the handshake is done, as its default
      // COMM_STORE_HELLO_MAX_BYTES at the smallest.
      const std::size_t limit = stage == Stage::kMessages
                                    ? proto::kMaxPayload
                                    : proto::kMaxHelloPayload;
      const auto state = reader.next(limit);
      if (state == proto::FrameReader::State::kTooLarge) return 0;
      if (state == proto::FrameReader::State::kNeedMore) break;
      if (reader.payload_size() > limit) std::abort();
      if (!handle(stage, from_client, reader)) return 0;
    }
  }
  return 0;
}
