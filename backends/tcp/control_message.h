// comm::tcp::ControlMessage: a message of the TCP backend's control
// protocol, sent on the control connections (Channel::kControl), never on
// the collective ones.
//
// Kinds: an abort ("my call failed, and this is why", sent to every peer so
// that they fail now rather than at their timeouts, naming the first
// cause); a heartbeat (nothing but "I am alive", sent by every rank's
// control thread at a fixed interval); a query and its answer ("which
// call is your collective number S?", asked of a peer that a step has
// waited on for a while, so that ranks that named different roots, and so
// exchange no message at all, find out); and a departure ("I shut my group
// down, after these collectives", sent as a rank whose group did not fail
// leaves, so that a peer still waiting for it names a program that ended
// early rather than a crash). See control_channel.h.
//
// On the wire (little-endian): a fixed prefix of kPrefixSize bytes (magic
// "CMCL", version, kind, the byte count of the body), then the body. A
// heartbeat has no body. The others' body: a CallInfo (the failed call,
// the call asked about, or the answerer's call of that sequence number),
// the error kind, the answer's state, the rank blamed or -1, the ranks the
// sender was still owed (for a timeout) and the text. decode() checks every
// length against the bytes it was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/tcp/message_header.h"
#include "libcomm/error.h"

namespace comm::tcp {

enum class ControlKind : std::uint8_t {
  kAbort = 1,      // the sender's call failed
  kHeartbeat = 2,  // the sender is alive; no body
  kQuery = 3,      // which call is your collective `call.sequence`?
  kAnswer = 4,     // the reply to a query; see CallState
  kLeaving = 5,    // the sender shuts its group down; `text` says after what
};

// What a kAnswer says about the collective asked about.
enum class CallState : std::uint8_t {
  kNone = 0,        // not an answer
  kNotReached = 1,  // the answerer has not started that collective yet
  kStarted = 2,     // it has (running or done); `call` is its CallInfo
  kForgotten = 3,   // it ran too long ago for the answerer to remember
};

struct ControlMessage {
  static constexpr std::uint32_t kMagic = 0x4c434d43;  // "CMCL" on the wire
  static constexpr std::uint8_t kVersion = 1;
  static constexpr std::size_t kPrefixSize = 12;
  // The most body bytes a reader accepts; encode() cuts the rank list and
  // the text to fit.
  static constexpr std::size_t kMaxBodyBytes = 8192;

  ControlKind kind = ControlKind::kAbort;
  // The call that failed, is asked about, or the answer; for kLeaving, the
  // sender's last collective, where it started one (`text` names it).
  CallInfo call;
  ErrorKind error = ErrorKind::kBackend;
  CallState state = CallState::kNone;  // for kAnswer
  std::int32_t blamed = -1;      // the rank the failure is blamed on, or -1
  std::vector<int> waiting_for;  // for a timeout: the ranks still owed
  std::string text;  // the sender's error message; for kLeaving, its calls

  // The whole message, prefix and body.
  std::vector<std::uint8_t> encode() const;
  // The body's byte count that a prefix (kPrefixSize bytes) announces, or
  // nothing when they are not a control message of a known version, or
  // announce more than kMaxBodyBytes.
  static std::optional<std::size_t> body_size(const std::uint8_t* prefix);
  // Reads one whole message of `size` bytes, prefix and body. Returns
  // nothing when it is malformed: a bad prefix, a size other than the one
  // the prefix announces, an unknown kind, collective, dtype, op or error
  // kind or state, a field that runs past the end, a heartbeat with a body,
  // or bytes left over.
  static std::optional<ControlMessage> decode(const std::uint8_t* bytes,
                                              std::size_t size);
};

}  // namespace comm::tcp
