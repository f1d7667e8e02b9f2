#include "store/tcp_store_auth.h"

#include "libcomm/detail/crypto.h"

namespace comm::tcp_store_auth {
namespace {

namespace proto = tcp_store_protocol;

static_assert(proto::kProofSize == detail::kMacSize);
static_assert(proto::kNonceSize == detail::kNonceSize);

proto::ProofMac proof(std::string_view label, const std::string& token,
                      const proto::Nonce& client_nonce,
                      std::string_view server_nonce) {
  const auto key = detail::derive_key(token, "TCPStore handshake v2");
  const std::string_view client(
      reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  return detail::hmac_sha256(key, {label, client, server_nonce});
}

}  // namespace

proto::ProofMac client_proof(const std::string& token,
                             const proto::Nonce& client_nonce,
                             std::string_view server_nonce) {
  return proof("client", token, client_nonce, server_nonce);
}

proto::ProofMac server_proof(const std::string& token,
                             const proto::Nonce& client_nonce,
                             std::string_view server_nonce) {
  return proof("server", token, client_nonce, server_nonce);
}

bool proof_matches(const proto::ProofMac& expected,
                   const std::uint8_t* received, std::size_t size) {
  return detail::equal_in_constant_time(expected.data(), expected.size(),
                                        received, size);
}

}  // namespace comm::tcp_store_auth
