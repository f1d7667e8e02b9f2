// The header in front of every message of the TCP backend.
//
// It carries the whole call (collective, sequence number, dtype, count, op,
// root), so a rank that receives a message from a different call can say
// exactly how the two calls differ instead of misreading the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"

namespace comm::tcp {

enum class Collective : std::uint8_t {
  kBroadcast = 1,
  kReduce,
  kAllReduce,
  kAllGather,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,  // point-to-point; `root` holds the tag
};

const char* collective_name(Collective collective);

// One call as every rank sees it. Two ranks' CallInfo must be equal for
// their messages to belong together; `count` is per rank where the call's
// contributions differ in size (all_to_all's splits are not compared).
struct CallInfo {
  Collective collective = Collective::kBarrier;
  std::uint64_t sequence = 0;
  DType dtype = DType::kU8;
  std::int64_t count = 0;
  ReduceOp op = ReduceOp::kSum;
  std::int32_t root = -1;

  bool operator==(const CallInfo&) const = default;
  // "all_reduce #12 (float32 x 1024, sum)".
  std::string describe() const;
};

struct MessageHeader {
  static constexpr std::uint32_t kMagic = 0x43544d43;  // "CMTC" on the wire
  // 40 bytes of fields, then zeros to the end of one 64-byte cache line,
  // so that a payload lies a multiple of 64 bytes from where its message
  // starts. Over loopback a blocking message usually starts a fresh kernel
  // page fragment, so a payload then sits at a multiple of 64 bytes from
  // any 64-byte-aligned buffer, and the kernel's `rep movsb` copies in and
  // out of the socket avoid destinations 1 to 31 bytes past their source
  // modulo 4 KiB, which some x86 CPUs copy an order of magnitude slower
  // (bench/README.md, "Copy distance"; libcomm/detail/copy_bytes.h).
  static constexpr std::size_t kWireSize = 64;

  CallInfo call;
  std::uint64_t payload_bytes = 0;
  // The payload says where the sender's part lies in its memory, for the
  // receiver to read there (CollectiveStep::send_address), instead of
  // being the part.
  bool address = false;

  void encode(std::uint8_t* out) const;
  // Returns false when the bytes do not start with kMagic or name an unknown
  // collective, dtype or op.
  bool decode(const std::uint8_t* in);
};

}  // namespace comm::tcp
