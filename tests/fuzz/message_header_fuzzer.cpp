// libFuzzer target for the TCP backend's message header: the first 64
// bytes of the input are decoded as a MessageHeader, as a rank decodes what
// a peer (or a stranger) sent. Properties checked besides memory safety:
// decode accepts exactly the headers with the magic, known collective,
// dtype and op values and a kind byte of 0 or 1 (data or address); what
// decodes re-encodes to the same bytes (with the reserved bytes zero),
// decodes again to the same header, and can be described, as an error
// message does.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/tcp/message_header.h"

using comm::tcp::MessageHeader;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < MessageHeader::kWireSize) return 0;
  std::uint32_t magic = 0;
  std::memcpy(&magic, data, sizeof(magic));
  const bool valid =
      magic == MessageHeader::kMagic && data[4] >= 1 &&
      data[4] <= static_cast<std::uint8_t>(comm::tcp::Collective::kSend) &&
      data[5] <= static_cast<std::uint8_t>(comm::DType::kBool) &&
      data[6] <= static_cast<std::uint8_t>(comm::ReduceOp::kBxor) &&
      data[7] <= 1;

  MessageHeader header;
  if (header.decode(data) != valid) std::abort();
  if (!valid) return 0;

  const std::string text = header.call.describe();
  if (text.empty()) std::abort();

  std::array<std::uint8_t, MessageHeader::kWireSize> again{};
  header.encode(again.data());
  std::array<std::uint8_t, MessageHeader::kWireSize> expected{};
  std::memcpy(expected.data(), data, expected.size());
  std::memset(expected.data() + 28, 0, 4);                     // reserved
  std::memset(expected.data() + 40, 0, expected.size() - 40);  // padding
  if (again != expected) std::abort();

  MessageHeader twice;
  if (!twice.decode(again.data()) || !(twice.call == header.call) ||
      twice.payload_bytes != header.payload_bytes ||
      twice.address != header.address) {
    std::abort();
  }
  return 0;
}
