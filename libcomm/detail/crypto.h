// The few cryptographic primitives libcomm's authentication needs, from
// OpenSSL's libcrypto: HMAC-SHA256, HKDF-SHA256, a CSPRNG and a constant-time
// comparison. Nothing here is hand-written cryptography; these are thin
// wrappers that turn OpenSSL's failures into comm::Error.
//
// Used by the TCPStore handshake (store/) and the TCP backend's rank
// connections (backends/tcp/), which authenticate with challenge-response:
// each side sends a fresh random nonce and proves knowledge of a shared key
// by an HMAC over both nonces, so the key never crosses the wire and a
// recorded exchange cannot be replayed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace comm::detail {

inline constexpr std::size_t kMacSize = 32;    // HMAC-SHA256
inline constexpr std::size_t kNonceSize = 32;  // fresh per handshake
using Mac = std::array<std::uint8_t, kMacSize>;
using Nonce = std::array<std::uint8_t, kNonceSize>;

// Random bytes from OpenSSL's CSPRNG. Throws BackendError when it has no
// entropy (it never returns predictable bytes).
Nonce random_nonce();

// HMAC-SHA256 of the concatenation of `parts` under `key`. The parts are
// length-prefixed before they are hashed, so ("ab", "c") and ("a", "bc")
// give different MACs.
Mac hmac_sha256(const std::vector<std::uint8_t>& key,
                std::initializer_list<std::string_view> parts);

// HKDF-SHA256 (RFC 5869) of `secret` with libcomm's fixed salt, for
// `purpose`: a 32-byte key that says nothing about the secret or about the
// keys for other purposes.
std::vector<std::uint8_t> derive_key(std::string_view secret,
                                     std::string_view purpose);

// Compares in time that depends only on the sizes, not on where the bytes
// differ. Different sizes compare unequal.
bool equal_in_constant_time(const std::uint8_t* a, std::size_t a_size,
                            const std::uint8_t* b, std::size_t b_size);

inline std::string_view as_text(const Nonce& nonce) {
  return {reinterpret_cast<const char*>(nonce.data()), nonce.size()};
}

}  // namespace comm::detail
