#include "backends/tcp/rank_handshake.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "libcomm/detail/crypto.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"

namespace comm::tcp {
namespace {

constexpr std::uint32_t kMagic = 0x32544d43;     // "CMT2" on the wire
constexpr std::uint32_t kOldMagic = 0x48544d43;  // "CMTH": libcomm 0.1's
// Raised whenever what ranks send each other changes: a rank refuses a
// peer of another version rather than misread its messages.
constexpr std::uint8_t kVersion = 4;

constexpr std::uint8_t kRefused = 0;
constexpr std::uint8_t kAccepted = 1;
constexpr std::uint8_t kChallenge = 2;

struct Hello {
  std::uint32_t magic = kMagic;
  std::uint8_t channel = 0;
  std::uint8_t version = kVersion;
  std::uint8_t authenticated = 0;
  std::uint8_t reserved = 0;
  std::uint64_t job = 0;
  std::int32_t rank = 0;
  std::int32_t size = 0;
  detail::Nonce nonce{};
};
// The first 24 bytes have the layout of libcomm 0.1's whole handshake, so
// that one is recognised and refused with a clear warning.
constexpr std::size_t kHeadSize = 24;
static_assert(sizeof(Hello) == kHeadSize + detail::kNonceSize);

std::string_view bytes_of(const void* data, std::size_t size) {
  return {static_cast<const char*>(data), size};
}

detail::Mac mac_of(const std::vector<std::uint8_t>& key, std::string_view role,
                   const Hello& hello, const detail::Nonce& accepting_nonce) {
  return detail::hmac_sha256(key, {role, bytes_of(&hello, sizeof(hello)),
                                   detail::as_text(accepting_nonce)});
}

void send_byte(detail::Socket& connection, std::uint8_t byte) {
  // Best effort: a refused peer may be gone already.
  (void)::send(connection.fd(), &byte, 1, MSG_NOSIGNAL);
}

}  // namespace

void connect_handshake(detail::Socket& connection, const GroupIdentity& group,
                       int channel, int peer, const std::string& peer_name,
                       detail::Clock::time_point deadline,
                       const std::function<void(bool closed)>& watch,
                       detail::Clock::duration slice) {
  // A closed or reset connection is a PeerError from send_all and
  // recv_all; the watch hears of it first.
  const auto exchange = [&](auto&& step) {
    try {
      step();
    } catch (const PeerError&) {
      if (watch) watch(true);
      throw;
    }
  };
  const auto send = [&](const void* data, std::size_t size) {
    exchange(
        [&] { connection.send_all(data, size, deadline, peer_name, peer); });
  };
  const auto receive = [&](void* data, std::size_t size) {
    exchange(
        [&] { connection.recv_all(data, size, deadline, peer_name, peer); });
  };
  const bool authenticated = !group.key.empty();
  Hello hello;
  hello.channel = static_cast<std::uint8_t>(channel);
  hello.authenticated = authenticated ? 1 : 0;
  hello.job = group.job;
  hello.rank = group.rank;
  hello.size = group.size;
  hello.nonce = detail::random_nonce();
  send(&hello, sizeof(hello));
  // Bounded by the deadline: each round waits a slice at most.
  while (watch && detail::Clock::now() < deadline &&
         !connection.wait_readable(
             std::min(deadline, detail::Clock::now() + slice))) {
    watch(false);
  }
  std::uint8_t answer = kRefused;
  receive(&answer, 1);
  if (answer == kRefused) {
    throw PeerError(peer, peer_name +
                              " refused our connection (a rank of another "
                              "job, or of another libcomm version?)");
  }
  if (!authenticated) {
    if (answer != kAccepted) {
      throw PeerError(peer, peer_name +
                                " demands authentication but this rank has "
                                "no key: the ranks' stores differ in "
                                "COMM_STORE_TOKEN");
    }
    return;
  }
  if (answer != kChallenge) {
    throw PeerError(peer, peer_name +
                              " accepted our connection without "
                              "authenticating it: it does not hold the job's "
                              "key (COMM_STORE_TOKEN); an impostor?");
  }
  detail::Nonce accepting_nonce{};
  receive(accepting_nonce.data(), accepting_nonce.size());
  const detail::Mac mine =
      mac_of(group.key, "connector", hello, accepting_nonce);
  send(mine.data(), mine.size());
  receive(&answer, 1);
  if (answer != kAccepted) {
    throw PeerError(peer, peer_name +
                              " refused our proof of the job's key: its "
                              "COMM_STORE_TOKEN differs from ours");
  }
  detail::Mac theirs{};
  receive(theirs.data(), theirs.size());
  const detail::Mac expected =
      mac_of(group.key, "acceptor", hello, accepting_nonce);
  if (!detail::equal_in_constant_time(expected.data(), expected.size(),
                                      theirs.data(), theirs.size())) {
    throw PeerError(peer, peer_name +
                              " did not prove that it holds the job's key "
                              "(COMM_STORE_TOKEN): an impostor at the "
                              "address the store gave for it?");
  }
}

std::optional<AcceptedPeer> accept_handshake(
    detail::Socket& connection, const GroupIdentity& group, int channel_count,
    const std::function<bool(int, int)>& wanted,
    detail::Clock::time_point deadline) {
  const std::string who = "an incoming connection";
  auto refuse = [&](const std::string& why) -> std::optional<AcceptedPeer> {
    send_byte(connection, kRefused);
    COMM_LOG_WARN("TCP backend: rank {} refused {}: {}", group.rank, who, why);
    return std::nullopt;
  };
  Hello hello;
  try {
    connection.recv_all(&hello, kHeadSize, deadline, who);
    if (hello.magic == kOldMagic) {
      return refuse(
          "it speaks the rank handshake of an older libcomm, which has no "
          "authentication; run the same libcomm version on every rank");
    }
    if (hello.magic != kMagic) {
      return refuse("it is not a libcomm rank (bad magic)");
    }
    if (hello.version != kVersion) {
      return refuse("it speaks version " + std::to_string(hello.version) +
                    " of the rank protocol and this rank speaks version " +
                    std::to_string(kVersion) +
                    "; run the same libcomm version on every rank");
    }
    connection.recv_all(reinterpret_cast<std::uint8_t*>(&hello) + kHeadSize,
                        sizeof(hello) - kHeadSize, deadline, who);
  } catch (const Error& e) {
    COMM_LOG_WARN("TCP backend: dropping an incoming connection: {}", e.what());
    return std::nullopt;
  }
  const bool fits = hello.job == group.job && hello.size == group.size &&
                    hello.rank > group.rank && hello.rank < group.size &&
                    hello.channel < channel_count &&
                    wanted(hello.rank, hello.channel);
  if (!fits) {
    return refuse("it claims rank " + std::to_string(hello.rank) + " of " +
                  std::to_string(hello.size) + " in job " +
                  std::to_string(hello.job) + ", channel " +
                  std::to_string(hello.channel) + "; this rank expects job " +
                  std::to_string(group.job) + " of size " +
                  std::to_string(group.size));
  }
  const bool authenticated = !group.key.empty();
  if (hello.authenticated != (authenticated ? 1 : 0)) {
    return refuse(
        authenticated
            ? "it claims rank " + std::to_string(hello.rank) +
                  " but does not authenticate, and this job's store has a "
                  "token (COMM_STORE_TOKEN)"
            : "it claims rank " + std::to_string(hello.rank) +
                  " and wants to authenticate, but this rank's store has no "
                  "token (COMM_STORE_TOKEN)");
  }
  if (authenticated) {
    try {
      const detail::Nonce mine = detail::random_nonce();
      std::uint8_t challenge[1 + detail::kNonceSize];
      challenge[0] = kChallenge;
      std::memcpy(challenge + 1, mine.data(), mine.size());
      connection.send_all(challenge, sizeof(challenge), deadline, who);
      detail::Mac theirs{};
      connection.recv_all(theirs.data(), theirs.size(), deadline, who);
      const detail::Mac expected = mac_of(group.key, "connector", hello, mine);
      if (!detail::equal_in_constant_time(expected.data(), expected.size(),
                                          theirs.data(), theirs.size())) {
        return refuse("it claims rank " + std::to_string(hello.rank) +
                      " but its proof of the job's key is wrong (a "
                      "different COMM_STORE_TOKEN, or a stranger)");
      }
      std::uint8_t accepted[1 + detail::kMacSize];
      accepted[0] = kAccepted;
      const detail::Mac proof = mac_of(group.key, "acceptor", hello, mine);
      std::memcpy(accepted + 1, proof.data(), proof.size());
      connection.send_all(accepted, sizeof(accepted), deadline, who);
    } catch (const Error& e) {
      COMM_LOG_WARN("TCP backend: dropping an incoming connection: {}",
                    e.what());
      return std::nullopt;
    }
  } else {
    send_byte(connection, kAccepted);
  }
  return AcceptedPeer{hello.rank, hello.channel};
}

}  // namespace comm::tcp
