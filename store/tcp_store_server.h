// comm::TCPStoreServer: the server side of TCPStore, a libuv event loop on a
// thread of its own.
//
// Rank 0 starts one inside its TCPStore (TCPStoreOptions::is_server), and the
// comm-store tool runs one standalone. Waiters are answered when their keys
// are set, never by polling; idle connections cost no CPU. A connection that
// breaks the protocol (bad magic, wrong token, a frame longer than the limit,
// malformed fields) is closed without affecting the others, and nothing is
// allocated for a length the server refuses. One client cannot exhaust it:
// before its hello is accepted a client may send only a hello-sized frame
// and must finish within a deadline; a client that does not read its replies
// is not read either once they pass a bound; connections past a cap are
// closed at once; and warnings about refused clients are rate-limited. The
// limits are COMM_STORE_* knobs (see the README), read at construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "libcomm/export.h"

namespace comm {

struct TCPStoreServerOptions {
  // The address to listen on. A host name listens on the interface it
  // resolves to, so "127.0.0.1" or "localhost" stays on loopback; "0.0.0.0"
  // or "::" listens everywhere.
  std::string host = "127.0.0.1";
  // 0 picks a free port; port() says which.
  std::uint16_t port = 0;
  // The token clients must present. Unset: COMM_STORE_TOKEN if set, else
  // none. Empty: none.
  std::optional<std::string> token;
  int backlog = 4096;
};

class COMM_API TCPStoreServer {
 public:
  // Binds, listens and starts the loop thread. Throws SystemError naming the
  // address when it cannot bind (say, the port is taken).
  explicit TCPStoreServer(TCPStoreServerOptions options = {});
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  // COMM_STORE_TOKEN's value, or "" (no token) when it is unset: what a
  // server demands and a client presents when their options name no token.
  static std::string environment_token();

  const std::string& host() const;
  std::uint16_t port() const;
  // Connections open now (greeted or not).
  std::size_t connection_count() const;

  // Closes every connection and the listener and joins the loop thread.
  // Clients see their connection close. Idempotent; the destructor calls it.
  // Returns true when every libuv handle was closed and the loop closed
  // without error (otherwise the log says what was left).
  bool stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace comm
