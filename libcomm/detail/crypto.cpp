#include "libcomm/detail/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <memory>
#include <string>

#include "libcomm/error.h"

namespace comm::detail {
namespace {

[[noreturn]] void throw_openssl(const char* what) {
  char reason[256] = "unknown error";
  const unsigned long code = ERR_get_error();
  if (code != 0) ERR_error_string_n(code, reason, sizeof(reason));
  ERR_clear_error();
  throw BackendError(std::string("OpenSSL ") + what + " failed: " + reason);
}

constexpr std::string_view kSalt = "libcomm key derivation v1";

}  // namespace

Nonce random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw_openssl("RAND_bytes");
  }
  return nonce;
}

Mac hmac_sha256(const std::vector<std::uint8_t>& key,
                std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MAC, decltype(&EVP_MAC_free)> mac(
      EVP_MAC_fetch(nullptr, "HMAC", nullptr), EVP_MAC_free);
  if (!mac) throw_openssl("EVP_MAC_fetch(HMAC)");
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(
      EVP_MAC_CTX_new(mac.get()), EVP_MAC_CTX_free);
  if (!ctx) throw_openssl("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  // An empty key is valid for HMAC, but OpenSSL wants a non-null pointer.
  static const std::uint8_t kNoKey = 0;
  if (EVP_MAC_init(ctx.get(), key.empty() ? &kNoKey : key.data(), key.size(),
                   params) != 1) {
    throw_openssl("EVP_MAC_init");
  }
  for (std::string_view part : parts) {
    std::uint8_t length[8];
    const std::uint64_t n = part.size();
    for (int i = 0; i < 8; ++i)
      length[i] = static_cast<std::uint8_t>(n >> (8 * i));
    if (EVP_MAC_update(ctx.get(), length, sizeof(length)) != 1 ||
        EVP_MAC_update(ctx.get(),
                       reinterpret_cast<const unsigned char*>(part.data()),
                       part.size()) != 1) {
      throw_openssl("EVP_MAC_update");
    }
  }
  Mac out{};
  std::size_t written = 0;
  if (EVP_MAC_final(ctx.get(), out.data(), &written, out.size()) != 1 ||
      written != out.size()) {
    throw_openssl("EVP_MAC_final");
  }
  return out;
}

std::vector<std::uint8_t> derive_key(std::string_view secret,
                                     std::string_view purpose) {
  std::unique_ptr<EVP_KDF, decltype(&EVP_KDF_free)> kdf(
      EVP_KDF_fetch(nullptr, "HKDF", nullptr), EVP_KDF_free);
  if (!kdf) throw_openssl("EVP_KDF_fetch(HKDF)");
  std::unique_ptr<EVP_KDF_CTX, decltype(&EVP_KDF_CTX_free)> ctx(
      EVP_KDF_CTX_new(kdf.get()), EVP_KDF_CTX_free);
  if (!ctx) throw_openssl("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  // OSSL_PARAM takes non-const pointers but only reads them here.
  std::string key(secret), salt(kSalt), info(purpose);
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, key.data(),
                                        key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt.data(),
                                        salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info.data(),
                                        info.size()),
      OSSL_PARAM_construct_end()};
  std::vector<std::uint8_t> out(kMacSize);
  const int status = EVP_KDF_derive(ctx.get(), out.data(), out.size(), params);
  OPENSSL_cleanse(key.data(), key.size());
  if (status != 1) throw_openssl("EVP_KDF_derive(HKDF)");
  return out;
}

bool equal_in_constant_time(const std::uint8_t* a, std::size_t a_size,
                            const std::uint8_t* b, std::size_t b_size) {
  if (a_size != b_size) return false;
  if (a_size == 0) return true;
  return CRYPTO_memcmp(a, b, a_size) == 0;
}

}  // namespace comm::detail
