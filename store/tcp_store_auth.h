// The proofs of the TCPStore handshake (store/tcp_store_protocol.h): each
// side proves it knows the token by an HMAC-SHA256 over both sides' nonces,
// under a key derived from the token (HKDF), with a label per direction so
// that the server's proof can never stand in for a client's.
#pragma once

#include <string>

#include "store/tcp_store_protocol.h"

namespace comm::tcp_store_auth {

tcp_store_protocol::ProofMac client_proof(
    const std::string& token, const tcp_store_protocol::Nonce& client_nonce,
    std::string_view server_nonce);
tcp_store_protocol::ProofMac server_proof(
    const std::string& token, const tcp_store_protocol::Nonce& client_nonce,
    std::string_view server_nonce);

// Whether `received` (of any size) is `expected`, in constant time.
bool proof_matches(const tcp_store_protocol::ProofMac& expected,
                   const std::uint8_t* received, std::size_t size);

}  // namespace comm::tcp_store_auth
