// The handshake that opens each of the TCP backend's rank connections
// (backends/tcp/mesh.h), on the connecting side and on the accepting side.
//
// The connecting rank (the higher one) sends a 56-byte hello:
//   magic "CMT2" (u32) | channel (u8) | version (u8) | authenticated (u8)
//   | reserved (u8) | job id (u64) | rank (i32) | world size (i32)
//   | nonce (32 bytes)
// in host byte order (the backend serves one kind of host per job). The
// accepting rank checks job, size, rank and channel, then answers one byte:
//   1: accepted. Without a key, the connection is open.
//   0: refused (a stale job, a stranger, an older libcomm); it closes.
//   2: a challenge, followed by its own 32-byte nonce.
// With a key (derived from the store's token: Store::derive_key), the
// connecting rank answers the challenge with HMAC-SHA256(key, "connector",
// hello, accepting nonce), and the accepting rank answers 1 followed by
// HMAC-SHA256(key, "acceptor", hello, accepting nonce), or 0. Each side
// checks the other's MAC in constant time, so a rank connection is made only
// between two holders of the key; the key never crosses the wire, and fresh
// nonces on both sides make a recorded exchange useless on another
// connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "libcomm/detail/socket.h"

namespace comm::tcp {

// What both sides know about the group before they connect.
struct GroupIdentity {
  std::uint64_t job = 0;
  int rank = 0;
  int size = 0;
  // 32 bytes, or empty when the store has no secret: no authentication.
  std::vector<std::uint8_t> key;
};

// Opens `connection` to `peer` as `group.rank` on `channel`. Throws
// PeerError naming the peer when it refuses, or when it does not prove that
// it holds the key; TimeoutError at the deadline. The peer answers once it
// accepts, which may be long after the connection was made: where given,
// `watch(false)` is called every `slice` while this rank waits for the
// first answer, and `watch(true)` where the peer closes or resets the
// connection in the middle of the handshake, before that is passed on; the
// watch ends the handshake by throwing.
void connect_handshake(detail::Socket& connection, const GroupIdentity& group,
                       int channel, int peer, const std::string& peer_name,
                       detail::Clock::time_point deadline,
                       const std::function<void(bool closed)>& watch = nullptr,
                       detail::Clock::duration slice = std::chrono::seconds(1));

struct AcceptedPeer {
  int rank = 0;
  int channel = 0;
};

// Runs the accepting side on a new `connection`. `wanted(rank, channel)`
// says whether this rank still waits for that connection. Returns the
// peer's rank and channel when it is accepted; otherwise logs a warning that
// says why (a stranger, a stale job, a wrong key, an older libcomm) and
// returns nothing, and the caller drops the connection.
std::optional<AcceptedPeer> accept_handshake(
    detail::Socket& connection, const GroupIdentity& group, int channel_count,
    const std::function<bool(int rank, int channel)>& wanted,
    detail::Clock::time_point deadline);

}  // namespace comm::tcp
