// comm::TCPStore: the client of a TCPStoreServer, and optionally its host.
//
// The usual set-up, as in c10d: rank 0 constructs its TCPStore with
// is_server, which starts a server in-process and connects to it; every other
// rank connects to MASTER_ADDR:MASTER_PORT. Connecting retries with backoff
// until the timeout, so ranks may start in any order.
//
// One connection per TCPStore, used by one call at a time (calls from
// several threads are serialised). Every call is bounded by a timeout: the
// per-call one for get, wait and multi_get, the store's for the rest.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "store/store.h"
#include "store/tcp_store_server.h"

namespace comm {

namespace tcp_store_protocol {
struct Message;
struct Welcome;
class FrameReader;
}  // namespace tcp_store_protocol
namespace detail {
class Socket;
}

struct TCPStoreOptions {
  std::string host = "127.0.0.1";
  // With is_server, 0 picks a free port; port() then says which.
  std::uint16_t port = 29500;
  // Host the server in this process, listening on `host`.
  bool is_server = false;
  Store::Duration timeout = Store::kDefaultTimeout;
  // The token to prove (and, with is_server, to demand); it is never sent.
  // Unset: COMM_STORE_TOKEN if set, else none. Empty: none.
  std::optional<std::string> token;
};

class COMM_API TCPStore final : public Store {
 public:
  // Connects (and first starts the server, with is_server). Throws
  // TimeoutError when no server answers within the timeout, InvalidArgument
  // when the server refuses the token (or has one and this client none, or
  // the reverse: the message says which), PeerError when the server does
  // not prove that it knows the token, BackendError when it speaks another
  // protocol version. With a token, client and server authenticate each
  // other by challenge-response; the token itself is never sent.
  explicit TCPStore(TCPStoreOptions options);
  ~TCPStore() override;

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  // The server this store hosts, or null.
  TCPStoreServer* server() const { return server_.get(); }

 private:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Duration timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  std::int64_t do_num_keys() override;
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  Duration timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override;
  void do_append(const std::string& key, const Bytes& value) override;
  // Empty without a token; else HKDF of the token for the purpose.
  Bytes do_derive_key(const std::string& purpose) override;

  void handshake();
  [[noreturn]] void throw_bad_token() const;
  // Answers the server's challenge and checks the server's own proof.
  void authenticate(const std::array<std::uint8_t, 32>& client_nonce,
                    const Bytes& server_nonce,
                    std::chrono::steady_clock::time_point deadline);
  tcp_store_protocol::Welcome read_welcome(
      std::chrono::steady_clock::time_point deadline);
  // Sends a request and returns the kOk response; a kError response becomes
  // InvalidArgument with the server's message.
  tcp_store_protocol::Message call(const tcp_store_protocol::Message& request);
  // The same for kGet and kWait, which the server answers only when the keys
  // are set: after `timeout` it cancels the request and throws TimeoutError.
  tcp_store_protocol::Message call_blocking(
      const tcp_store_protocol::Message& request, Duration timeout);
  void send_request(const tcp_store_protocol::Message& request);
  // Receives until inbox_ holds a whole frame, which it then hands out.
  void read_frame(std::chrono::steady_clock::time_point deadline);
  tcp_store_protocol::Message read_response();
  // `response` when its status is kOk. Throws InvalidArgument with the
  // server's message for kError (the request had no effect, and the
  // connection stays usable), PeerError for any other status.
  tcp_store_protocol::Message checked_answer(
      tcp_store_protocol::Message response);

  std::string host_;
  std::uint16_t port_;
  std::string name_;  // "TCPStore server 127.0.0.1:29500", for messages
  // COMM_STORE_TOKEN or the options' token; empty for none. Never sent.
  std::string token_;
  std::unique_ptr<TCPStoreServer> server_;
  std::mutex mutex_;
  std::unique_ptr<detail::Socket> socket_;
  // Bytes received but not yet consumed: one recv usually brings a whole
  // answer, header and payload together.
  std::unique_ptr<tcp_store_protocol::FrameReader> inbox_;
};

}  // namespace comm
