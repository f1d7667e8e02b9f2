// comm::tcp::MessageHeader: the 64-byte header in front of every message of
// the TCP backend, and CallInfo::describe, which names a call in errors.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstring>

#include "backends/tcp/message_header.h"

using comm::DType;
using comm::ReduceOp;
using comm::tcp::CallInfo;
using comm::tcp::Collective;
using comm::tcp::MessageHeader;

namespace {

using Wire = std::array<std::uint8_t, MessageHeader::kWireSize>;

// Byte offsets of the fields on the wire (little-endian).
constexpr std::size_t kCollectiveAt = 4;
constexpr std::size_t kDTypeAt = 5;
constexpr std::size_t kOpAt = 6;
constexpr std::size_t kAddressAt = 7;

Wire encoded(const MessageHeader& header) {
  // Not zeros, so that the layout test sees the zeros encode writes.
  Wire wire;
  wire.fill(0xa5);
  header.encode(wire.data());
  return wire;
}

MessageHeader sample() {
  MessageHeader header;
  header.call = {Collective::kAllReduce, 12, DType::kBF16, 1024,
                 ReduceOp::kMax,         -1};
  header.payload_bytes = 2048;
  return header;
}

}  // namespace

TEST_CASE("every collective, dtype and op survives an encode/decode round trip",
          "[tcp][header]") {
  const Collective collectives[] = {
      Collective::kBroadcast,     Collective::kReduce,   Collective::kAllReduce,
      Collective::kAllGather,     Collective::kGather,   Collective::kScatter,
      Collective::kReduceScatter, Collective::kAllToAll, Collective::kBarrier,
      Collective::kSend};
  for (Collective collective : collectives) {
    for (DType dtype : comm::kAllDTypes) {
      for (ReduceOp op : comm::kAllReduceOps) {
        MessageHeader header;
        header.call = {
            collective, 0xfedcba9876543210ULL, dtype, -1234567890123LL, op, -7};
        header.payload_bytes = 0x0123456789abcdefULL;
        for (bool address : {false, true}) {
          header.address = address;
          const Wire wire = encoded(header);
          MessageHeader decoded;
          REQUIRE(decoded.decode(wire.data()));
          CHECK(decoded.call == header.call);
          CHECK(decoded.payload_bytes == header.payload_bytes);
          CHECK(decoded.address == address);
        }
      }
    }
  }
}

TEST_CASE("the header's layout on the wire is fixed", "[tcp][header]") {
  const Wire wire = encoded(sample());
  // "CMTC" as a little-endian 32-bit word, then the enums as single bytes.
  CHECK(wire[0] == 0x43);
  CHECK(wire[1] == 0x4d);
  CHECK(wire[2] == 0x54);
  CHECK(wire[3] == 0x43);
  CHECK(wire[kCollectiveAt] ==
        static_cast<std::uint8_t>(Collective::kAllReduce));
  CHECK(wire[kDTypeAt] == static_cast<std::uint8_t>(DType::kBF16));
  CHECK(wire[kOpAt] == static_cast<std::uint8_t>(ReduceOp::kMax));
  CHECK(wire[kAddressAt] == 0);
  MessageHeader address = sample();
  address.address = true;
  CHECK(encoded(address)[kAddressAt] == 1);
  std::uint64_t sequence = 0, payload = 0;
  std::memcpy(&sequence, wire.data() + 8, 8);
  std::memcpy(&payload, wire.data() + 32, 8);
  CHECK(sequence == 12);
  CHECK(payload == 2048);
  // The fields end at byte 40; zeros fill the header to one cache line, so
  // that a payload follows its header 64 bytes later.
  CHECK(MessageHeader::kWireSize == 64);
  for (std::size_t i = 40; i < wire.size(); ++i) {
    INFO("byte " << i);
    CHECK(wire[i] == 0);
  }
}

TEST_CASE("bytes that do not start with the magic are refused",
          "[tcp][header]") {
  for (std::size_t i = 0; i < 4; ++i) {
    Wire wire = encoded(sample());
    wire[i] ^= 0x01;
    MessageHeader decoded;
    CHECK_FALSE(decoded.decode(wire.data()));
  }
  Wire zeros{};
  MessageHeader decoded;
  CHECK_FALSE(decoded.decode(zeros.data()));
}

TEST_CASE("unknown collective, dtype, op and kind values are refused",
          "[tcp][header]") {
  struct Bad {
    std::size_t at;
    std::uint8_t value;
  };
  const Bad bad[] = {
      {kCollectiveAt, 0},
      {kCollectiveAt, static_cast<std::uint8_t>(Collective::kSend) + 1},
      {kCollectiveAt, 0xff},
      {kDTypeAt, static_cast<std::uint8_t>(DType::kBool) + 1},
      {kDTypeAt, 0xff},
      {kOpAt, static_cast<std::uint8_t>(ReduceOp::kBxor) + 1},
      {kOpAt, 0xff},
      {kAddressAt, 2},
      {kAddressAt, 0xff},
  };
  for (const Bad& b : bad) {
    INFO("byte " << b.at << " = " << int{b.value});
    Wire wire = encoded(sample());
    wire[b.at] = b.value;
    MessageHeader decoded;
    const MessageHeader before = decoded;
    CHECK_FALSE(decoded.decode(wire.data()));
    // A refused header leaves the call it was decoded into untouched.
    CHECK(decoded.call == before.call);
  }
}

TEST_CASE("describe names the call with the fields that matter to it",
          "[tcp][header]") {
  CHECK(sample().call.describe() == "all_reduce #12 (bfloat16 x 1024, max)");
  CallInfo barrier{Collective::kBarrier, 3, DType::kF32, 99, ReduceOp::kSum, 0};
  CHECK(barrier.describe() == "barrier #3");
  CallInfo broadcast{Collective::kBroadcast, 0, DType::kF32, 8,
                     ReduceOp::kSum,         2};
  CHECK(broadcast.describe() == "broadcast #0 (float32 x 8, root 2)");
  CallInfo reduce{Collective::kReduce, 1, DType::kI64, 4, ReduceOp::kMin, 1};
  CHECK(reduce.describe() == "reduce #1 (int64 x 4, min, root 1)");
  CallInfo send{Collective::kSend, 5, DType::kU8, 16, ReduceOp::kSum, 42};
  CHECK(send.describe() == "send #5 (uint8 x 16, tag 42)");
  // all_to_all's counts may differ per rank, so they are not named.
  CallInfo all_to_all{Collective::kAllToAll, 2, DType::kF64, 77,
                      ReduceOp::kSum,        -1};
  CHECK(all_to_all.describe() == "all_to_all #2 (float64)");
}
