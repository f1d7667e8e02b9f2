// libFuzzer target for the TCPStore server's input path: the bytes a client
// sends are cut into frames by FrameReader, in chunks of the sizes the input
// itself chooses (as TCP may deliver them), and each frame is decoded as a
// hello and as a request. Properties checked besides memory safety: a frame
// never exceeds the payload limit, and whatever decodes re-encodes to the
// same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "store/tcp_store_protocol.h"

namespace proto = comm::tcp_store_protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 1) return 0;
  // The first byte picks the chunk size for feeding the rest.
  const std::size_t chunk = 1 + data[0] % 64;
  data += 1;
  size -= 1;
  proto::FrameReader reader;
  bool greeted = false;
  for (std::size_t offset = 0; offset < size; offset += chunk) {
    reader.append(data + offset, std::min(chunk, size - offset));
    // Each frame consumes at least its length prefix, so this ends.
    while (true) {
      const auto state = reader.next();
      if (state == proto::FrameReader::State::kTooLarge) return 0;
      if (state == proto::FrameReader::State::kNeedMore) break;
      if (reader.payload_size() > proto::kMaxPayload) std::abort();
      if (!greeted) {
        proto::Hello hello;
        if (!proto::decode_hello(reader.payload(), reader.payload_size(),
                                 &hello)
                 .empty()) {
          return 0;  // the server closes the connection here
        }
        const auto again = proto::encode_hello(hello);
        if (again.size() != proto::kLengthSize + reader.payload_size() ||
            std::memcmp(again.data() + proto::kLengthSize, reader.payload(),
                        reader.payload_size()) != 0) {
          std::abort();
        }
        greeted = true;
        continue;
      }
      proto::Message message;
      if (!proto::decode_message(reader.payload(), reader.payload_size(),
                                 &message)
               .empty()) {
        return 0;
      }
      (void)proto::validate_request(message);
      const auto again = proto::encode_message(message);
      if (again.size() != proto::kLengthSize + reader.payload_size() ||
          proto::encoded_size(message) != reader.payload_size() ||
          std::memcmp(again.data() + proto::kLengthSize, reader.payload(),
                      reader.payload_size()) != 0) {
        std::abort();
      }
    }
  }
  return 0;
}
