#include "store/tcp_store_server.h"

#include <netdb.h>
#include <sys/resource.h>
#include <uv.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "libcomm/detail/crypto.h"
#include "libcomm/detail/descriptors.h"
#include "libcomm/detail/log.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"
#include "libcomm/string_param.h"
#include "store/key_value_table.h"
#include "store/tcp_store_auth.h"
#include "store/tcp_store_protocol.h"

namespace comm {

namespace proto = tcp_store_protocol;

namespace {

const StringParam kStoreToken{
    "COMM_STORE_TOKEN", "no token",
    "a secret the TCPStore server and its clients prove they share; unset: "
    "no authentication",
    ParamVisibility::kSecret};
const IntParam kHelloMaxBytes{
    "COMM_STORE_HELLO_MAX_BYTES", 8192,
    static_cast<std::int64_t>(tcp_store_protocol::kMaxHelloPayload), 1 << 20,
    "the longest frame a TCPStore server reads from a client before its hello"};
const IntParam kHelloTimeoutS{
    "COMM_STORE_HELLO_TIMEOUT_S", 30, 1, 86400,
    "seconds a TCPStore server gives a new connection to complete its hello"};
const IntParam kMaxQueuedBytes{
    "COMM_STORE_MAX_QUEUED_BYTES", 4 << 20, 64 << 10, 1 << 30,
    "unsent reply bytes at which a TCPStore server stops reading a client"};
const IntParam kMaxConnections{
    "COMM_STORE_MAX_CONNECTIONS", 16384, 1, 1 << 20,
    "connections a TCPStore server holds open; it closes new ones beyond"};
const IntParam kRefusalWarnings{
    "COMM_STORE_REFUSAL_WARNINGS", 10, 0, 1000000,
    "warnings about refused clients a TCPStore server logs per 10 seconds"};

// Descriptors kept free for the rest of the process when the connection cap
// is lowered to fit the hard RLIMIT_NOFILE, and below the soft limit before
// accept() raises it: the in-process server shares the limit with the
// rank's backend, files and logs.
constexpr std::uint64_t kReservedDescriptors = 64;

std::string address_string(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    uv_ip4_name(v4, host, sizeof(host));
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    uv_ip6_name(v6, host, sizeof(host));
    port = ntohs(v6->sin6_port);
  }
  return detail::host_port(host, static_cast<std::uint16_t>(port));
}

std::string uv_error(int status) {
  return std::string(uv_err_name(status)) + ": " + uv_strerror(status);
}

// Bounds the warnings about refused clients: the first `limit` of each
// interval are logged, the rest only counted, and the count is logged in one
// line when the interval ends. Loop-thread only; times are uv_now()'s.
class WarningLimiter {
 public:
  static constexpr std::uint64_t kIntervalMs = 10000;

  explicit WarningLimiter(std::uint64_t limit) : limit_(limit) {}

  // Whether the caller may log one more warning now.
  bool allow(std::uint64_t now_ms) {
    roll(now_ms);
    if (logged_ < limit_) {
      ++logged_;
      return true;
    }
    ++suppressed_;
    return false;
  }

  // Starts a new interval once the current one is over, first logging how
  // many warnings it suppressed. The server's sweep calls it every second,
  // so the count appears even when no further client is refused.
  void roll(std::uint64_t now_ms) {
    if (now_ms - start_ms_ < kIntervalMs) return;
    if (suppressed_ > 0) {
      COMM_LOG_WARN(
          "TCPStore server: {} more warnings about refused clients were "
          "suppressed in the last {} s (COMM_STORE_REFUSAL_WARNINGS)",
          suppressed_, (now_ms - start_ms_) / 1000);
    }
    start_ms_ = now_ms;
    logged_ = 0;
    suppressed_ = 0;
  }

 private:
  std::uint64_t limit_;
  std::uint64_t start_ms_ = 0;
  std::uint64_t logged_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace

struct TCPStoreServer::Impl {
  // One client connection. The handle comes first so that libuv's handle
  // pointer is also the Connection's.
  struct Connection {
    uv_tcp_t handle{};
    Impl* server = nullptr;
    std::string peer;
    proto::FrameReader reader;
    bool greeted = false;
    // Challenged and waiting for its proof; the nonces of the exchange.
    bool challenged = false;
    proto::Nonce client_nonce{};
    proto::Nonce server_nonce{};
    bool closing = false;
    // uv_now() when it was accepted, for the hello deadline.
    std::uint64_t accepted_ms = 0;
    // Reading is stopped because too many reply bytes are queued for it.
    bool paused = false;
    // A refusal is being flushed to it; it is never read again.
    bool refused = false;
    // The kGet or kWait waiting for its keys, if any.
    bool pending = false;
    proto::Op pending_op = proto::Op::kWait;
    std::vector<std::string> pending_keys;
  };

  struct WriteRequest {
    uv_write_t request{};
    Bytes frame;
    Connection* connection = nullptr;
  };

  std::string host;
  std::uint16_t port = 0;
  std::string token;
  uv_loop_t loop{};
  uv_tcp_t listener{};
  uv_async_t stop_signal{};
  // Fires every second: closes connections past the hello deadline and
  // ends the warning limiter's intervals.
  uv_timer_t sweep_timer{};
  std::thread thread;
  bool stopped = false;
  bool closed_cleanly = false;
  std::atomic<std::size_t> open_connections{0};

  // The limits, read from the knobs once, at construction.
  std::size_t hello_max_bytes = 0;
  std::uint64_t hello_timeout_ms = 0;
  std::size_t max_queued_bytes = 0;
  std::size_t max_connections = 0;
  // Why max_connections is what it is, for the refusal's log line.
  std::string max_connections_source;
  // The soft RLIMIT_NOFILE as last seen; accept() raises it while a
  // reserve is left.
  std::uint64_t descriptor_limit = 0;
  WarningLimiter refusal_warnings{0};

  // Loop-thread state.
  KeyValueTable table;
  std::unordered_set<Connection*> connections;
  std::unordered_map<std::string, std::unordered_set<Connection*>> waiters;
  char read_buffer[64 * 1024];

  explicit Impl(const TCPStoreServerOptions& options);
  ~Impl();
  void listen(const TCPStoreServerOptions& options);
  bool shut_down_loop();

  static void on_connection(uv_stream_t* listener, int status);
  static void on_alloc(uv_handle_t* handle, std::size_t, uv_buf_t* buffer);
  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t*);
  static void on_write(uv_write_t* request, int status);
  static void on_stop(uv_async_t* signal);
  static void on_sweep(uv_timer_t* timer);

  void accept();
  void refuse_over_cap();
  void read_frames(Connection* c);
  void pause_if_backlogged(Connection* c);
  bool warn_refusal();
  void handle_frame(Connection* c, const std::uint8_t* data, std::size_t size);
  void handle_hello(Connection* c, const std::uint8_t* data, std::size_t size);
  void handle_proof(Connection* c, const std::uint8_t* data, std::size_t size);
  void refuse(Connection* c, proto::HelloStatus status);
  void handle_request(Connection* c, proto::Message& request);
  void answer_when_ready(Connection* c, proto::Op op,
                         std::vector<std::string> keys);
  void answer_pending(Connection* c);
  void forget_pending(Connection* c);
  void key_changed(const std::string& key);
  void send(Connection* c, Bytes frame);
  void send_status(Connection* c, proto::Status status,
                   std::vector<Bytes> values = {}, std::int64_t number = 0);
  void close(Connection* c, const char* why);
  void close_after_flush(Connection* c);
};

TCPStoreServer::Impl::Impl(const TCPStoreServerOptions& options)
    : host(options.host) {
  if (options.token) {
    token = *options.token;
  } else {
    token = TCPStoreServer::environment_token();
  }
  if (token.size() > proto::kMaxTokenSize) {
    throw InvalidArgument("TCPStore token of " + std::to_string(token.size()) +
                          " bytes is longer than the limit of " +
                          std::to_string(proto::kMaxTokenSize));
  }
  hello_max_bytes = static_cast<std::size_t>(kHelloMaxBytes.get());
  hello_timeout_ms = static_cast<std::uint64_t>(kHelloTimeoutS.get()) * 1000;
  max_queued_bytes = static_cast<std::size_t>(kMaxQueuedBytes.get());
  max_connections = static_cast<std::size_t>(kMaxConnections.get());
  max_connections_source = "COMM_STORE_MAX_CONNECTIONS";
  refusal_warnings =
      WarningLimiter(static_cast<std::uint64_t>(kRefusalWarnings.get()));
  // Past the descriptor limit accept() fails anyway; a cap below the hard
  // limit refuses clients cleanly and leaves the rest of the process
  // descriptors to use. The soft limit rises as clients come (accept()).
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_max != RLIM_INFINITY &&
      files.rlim_max > 2 * kReservedDescriptors &&
      files.rlim_max - kReservedDescriptors < max_connections) {
    max_connections =
        static_cast<std::size_t>(files.rlim_max - kReservedDescriptors);
    max_connections_source = "the hard RLIMIT_NOFILE of " +
                             std::to_string(files.rlim_max) +
                             " less a reserve; raise ulimit -Hn";
  }
  descriptor_limit = detail::raise_descriptor_limit(0);
  int status = uv_loop_init(&loop);
  if (status != 0) throw BackendError("uv_loop_init: " + uv_error(status));
  uv_tcp_init(&loop, &listener);
  listener.data = this;
  uv_async_init(&loop, &stop_signal, on_stop);
  stop_signal.data = this;
  uv_timer_init(&loop, &sweep_timer);
  sweep_timer.data = this;
  uv_timer_start(&sweep_timer, on_sweep, 1000, 1000);
  try {
    listen(options);
  } catch (...) {
    shut_down_loop();
    throw;
  }
  thread = std::thread([this] { uv_run(&loop, UV_RUN_DEFAULT); });
}

void TCPStoreServer::Impl::listen(const TCPStoreServerOptions& options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(options.port);
  const int resolved =
      getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(),
                  service.c_str(), &hints, &addresses);
  if (resolved != 0) {
    throw InvalidArgument("TCPStore server: cannot resolve host '" +
                          options.host + "': " + gai_strerror(resolved));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(addresses,
                                                           freeaddrinfo);
  int status = UV_EADDRNOTAVAIL;
  for (const addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    status = uv_tcp_bind(&listener, a->ai_addr, 0);
    if (status == 0)
      status = uv_listen(reinterpret_cast<uv_stream_t*>(&listener),
                         options.backlog, on_connection);
    if (status == 0) break;
  }
  if (status != 0) {
    // A taken port is most often an earlier job's store still running.
    throw SystemError(
        -status, "TCPStore server: listen on " +
                     detail::host_port(options.host, options.port) +
                     (status == UV_EADDRINUSE
                          ? " (another process holds the port: choose a free "
                            "one, e.g. with MASTER_PORT, commrun --master-port "
                            "or comm-store --port)"
                          : ""));
  }
  sockaddr_storage bound{};
  int length = sizeof(bound);
  uv_tcp_getsockname(&listener, reinterpret_cast<sockaddr*>(&bound), &length);
  port = bound.ss_family == AF_INET
             ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
             : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  COMM_LOG_INFO("TCPStore server listening on {}", address_string(bound));
}

// Closes every handle and runs the loop until the closes are done, so that
// uv_loop_close finds nothing open. Returns whether the loop closed.
bool TCPStoreServer::Impl::shut_down_loop() {
  auto close_all = [](uv_handle_t* handle, void*) {
    if (!uv_is_closing(handle)) uv_close(handle, nullptr);
  };
  uv_walk(&loop, close_all, nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  const int status = uv_loop_close(&loop);
  if (status != 0) {
    COMM_LOG_ERROR("TCPStore server: the event loop did not close cleanly ({})",
                   uv_error(status));
  }
  return status == 0;
}

TCPStoreServer::Impl::~Impl() = default;

void TCPStoreServer::Impl::on_stop(uv_async_t* signal) {
  auto* self = static_cast<Impl*>(signal->data);
  for (Connection* c : std::vector<Connection*>(self->connections.begin(),
                                                self->connections.end())) {
    self->close(c, "the server is stopping");
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&self->listener), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_signal), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->sweep_timer), nullptr);
}

void TCPStoreServer::Impl::on_sweep(uv_timer_t* timer) {
  auto* self = static_cast<Impl*>(timer->data);
  const std::uint64_t now = uv_now(&self->loop);
  std::vector<Connection*> late;
  for (Connection* c : self->connections) {
    if (!c->greeted && !c->closing &&
        now - c->accepted_ms >= self->hello_timeout_ms) {
      late.push_back(c);
    }
  }
  for (Connection* c : late) {
    // A refused client was warned about already; its refusal is flushed no
    // longer than the deadline either.
    if (!c->refused && self->warn_refusal()) {
      COMM_LOG_WARN(
          "TCPStore server: closing {}: no hello within {} s "
          "(COMM_STORE_HELLO_TIMEOUT_S)",
          c->peer, self->hello_timeout_ms / 1000);
    }
    self->close(c, "it did not complete its hello in time");
  }
  self->refusal_warnings.roll(now);
}

bool TCPStoreServer::Impl::warn_refusal() {
  return refusal_warnings.allow(uv_now(&loop));
}

void TCPStoreServer::Impl::on_connection(uv_stream_t* listener, int status) {
  auto* self = static_cast<Impl*>(listener->data);
  if (status != 0) {
    if (self->warn_refusal()) {
      COMM_LOG_WARN("TCPStore server: accept failed: {}", uv_error(status));
    }
    return;
  }
  if (self->connections.size() >= self->max_connections) {
    self->refuse_over_cap();
    return;
  }
  self->accept();
}

void TCPStoreServer::Impl::accept() {
  auto* c = new Connection;
  c->server = this;
  uv_tcp_init(&loop, &c->handle);
  c->handle.data = c;
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener),
                reinterpret_cast<uv_stream_t*>(&c->handle)) != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
             [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
    return;
  }
  connections.insert(c);
  open_connections.store(connections.size(), std::memory_order_relaxed);
  // Descriptors are numbered lowest free first, so the new one's number is
  // about the count the process has open, the rank's own included.
  uv_os_fd_t fd = -1;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c->handle), &fd) == 0 &&
      static_cast<std::uint64_t>(fd) + kReservedDescriptors >=
          descriptor_limit) {
    descriptor_limit = detail::raise_descriptor_limit(
        static_cast<std::uint64_t>(fd) + kReservedDescriptors);
  }
  c->accepted_ms = uv_now(&loop);
  uv_tcp_nodelay(&c->handle, 1);
  sockaddr_storage peer{};
  int length = sizeof(peer);
  if (uv_tcp_getpeername(&c->handle, reinterpret_cast<sockaddr*>(&peer),
                         &length) == 0) {
    c->peer = address_string(peer);
  }
  COMM_LOG_DEBUG("TCPStore server: connection from {}", c->peer);
  uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), on_alloc, on_read);
}

// Accepts the connection and closes it at once, so that it leaves the
// backlog and its client sees a close instead of a hang.
void TCPStoreServer::Impl::refuse_over_cap() {
  auto* handle = new uv_tcp_t;
  uv_tcp_init(&loop, handle);
  auto free_handle = [](uv_handle_t* h) {
    delete reinterpret_cast<uv_tcp_t*>(h);
  };
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener),
                reinterpret_cast<uv_stream_t*>(handle)) != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(handle), free_handle);
    return;
  }
  if (warn_refusal()) {
    sockaddr_storage peer{};
    int length = sizeof(peer);
    std::string name = "?";
    if (uv_tcp_getpeername(handle, reinterpret_cast<sockaddr*>(&peer),
                           &length) == 0) {
      name = address_string(peer);
    }
    COMM_LOG_WARN(
        "TCPStore server: refusing {}: {} connections are open, the most it "
        "holds ({})",
        name, max_connections, max_connections_source);
  }
  uv_close(reinterpret_cast<uv_handle_t*>(handle), free_handle);
}

void TCPStoreServer::Impl::on_alloc(uv_handle_t* handle, std::size_t,
                                    uv_buf_t* buffer) {
  // The loop runs one callback at a time and on_read copies what it gets
  // into the connection's FrameReader, so one buffer serves everyone.
  Impl* self = static_cast<Connection*>(handle->data)->server;
  *buffer = uv_buf_init(self->read_buffer, sizeof(self->read_buffer));
}

void TCPStoreServer::Impl::on_read(uv_stream_t* stream, ssize_t nread,
                                   const uv_buf_t* buffer) {
  auto* c = static_cast<Connection*>(stream->data);
  Impl* self = c->server;
  if (nread < 0) {
    self->close(c, nread == UV_EOF ? "the client closed it"
                                   : uv_strerror(static_cast<int>(nread)));
    return;
  }
  c->reader.append(reinterpret_cast<const std::uint8_t*>(buffer->base),
                   static_cast<std::size_t>(nread));
  self->read_frames(c);
}

// Handles the whole frames the connection's reader holds, until it needs
// more bytes, the connection closes, or its replies back up. Bounded by the
// bytes received: every frame consumes some.
void TCPStoreServer::Impl::read_frames(Connection* c) {
  while (!c->closing && !c->paused && !c->refused) {
    // Until its hello is accepted a client is a stranger: only a frame the
    // size of a hello is read from it.
    const std::size_t limit = c->greeted ? proto::kMaxPayload : hello_max_bytes;
    const auto state = c->reader.next(limit);
    if (state == proto::FrameReader::State::kNeedMore) break;
    if (state == proto::FrameReader::State::kTooLarge) {
      if (!c->greeted && warn_refusal()) {
        COMM_LOG_WARN(
            "TCPStore server: closing {}: before its hello it announced a "
            "frame longer than {} bytes (COMM_STORE_HELLO_MAX_BYTES)",
            c->peer, hello_max_bytes);
      }
      close(c, "it announced a frame longer than the limit");
      break;
    }
    try {
      handle_frame(c, c->reader.payload(), c->reader.payload_size());
    } catch (const std::exception& e) {
      // Nothing may escape into libuv: record the error, drop the client.
      COMM_LOG_ERROR("TCPStore server: dropping {}: {}", c->peer, e.what());
      close(c, "the server failed to handle its request");
    }
  }
}

// Stops reading from a client whose unsent replies exceed the bound, so that
// one that sends requests and never reads the answers holds a bounded amount
// of the server's memory. on_write resumes it once the queue has drained.
void TCPStoreServer::Impl::pause_if_backlogged(Connection* c) {
  if (c->paused || c->closing || c->refused) return;
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->handle);
  if (uv_stream_get_write_queue_size(stream) <= max_queued_bytes) return;
  c->paused = true;
  uv_read_stop(stream);
  COMM_LOG_DEBUG(
      "TCPStore server: not reading from {} while {} reply bytes wait for it",
      c->peer, uv_stream_get_write_queue_size(stream));
}

void TCPStoreServer::Impl::handle_frame(Connection* c, const std::uint8_t* data,
                                        std::size_t size) {
  if (!c->greeted) {
    if (c->challenged) {
      handle_proof(c, data, size);
    } else {
      handle_hello(c, data, size);
    }
    return;
  }
  proto::Message request;
  std::string problem = proto::decode_message(data, size, &request);
  if (problem.empty()) problem = proto::validate_request(request);
  if (!problem.empty()) {
    if (warn_refusal()) {
      COMM_LOG_WARN("TCPStore server: closing {}: {}", c->peer, problem);
    }
    close(c, "it sent a malformed request");
    return;
  }
  if (c->pending &&
      static_cast<proto::Op>(request.code) != proto::Op::kCancel) {
    close(c, "it sent a request while its get or wait was pending");
    return;
  }
  handle_request(c, request);
}

void TCPStoreServer::Impl::handle_hello(Connection* c, const std::uint8_t* data,
                                        std::size_t size) {
  proto::Hello hello;
  const std::string problem = proto::decode_hello(data, size, &hello);
  if (!problem.empty()) {
    if (warn_refusal()) {
      COMM_LOG_WARN("TCPStore server: closing {}: {}", c->peer, problem);
    }
    close(c, "its hello was malformed");
    return;
  }
  if (hello.version != proto::kVersion) {
    if (warn_refusal()) {
      COMM_LOG_WARN(
          "TCPStore server: refusing {}: it speaks protocol version {}, this "
          "server speaks {}; run the same libcomm version on every rank",
          c->peer, hello.version, proto::kVersion);
    }
    refuse(c, proto::HelloStatus::kVersionMismatch);
    return;
  }
  if (token.empty() && hello.has_token) {
    if (warn_refusal()) {
      COMM_LOG_WARN(
          "TCPStore server: refusing {}: unexpected token: the client has a "
          "token but this server has none; set the same COMM_STORE_TOKEN on "
          "the server, or unset it on the clients",
          c->peer);
    }
    refuse(c, proto::HelloStatus::kTokenNotExpected);
    return;
  }
  if (!token.empty() && !hello.has_token) {
    if (warn_refusal()) {
      COMM_LOG_WARN(
          "TCPStore server: refusing {}: missing token: this server requires "
          "one (COMM_STORE_TOKEN) and the client has none",
          c->peer);
    }
    refuse(c, proto::HelloStatus::kTokenRequired);
    return;
  }
  proto::Welcome welcome;
  if (!token.empty()) {
    // The client proves it knows the token with an HMAC over its nonce and
    // this fresh one; the answer comes in handle_proof.
    c->challenged = true;
    c->client_nonce = hello.client_nonce;
    c->server_nonce = detail::random_nonce();
    welcome.status = proto::HelloStatus::kChallenge;
    welcome.data.assign(c->server_nonce.begin(), c->server_nonce.end());
    send(c, proto::encode_welcome(welcome));
    return;
  }
  send(c, proto::encode_welcome(welcome));
  c->greeted = true;
}

void TCPStoreServer::Impl::handle_proof(Connection* c, const std::uint8_t* data,
                                        std::size_t size) {
  proto::Proof proof;
  const std::string problem = proto::decode_proof(data, size, &proof);
  if (!problem.empty()) {
    if (warn_refusal()) {
      COMM_LOG_WARN("TCPStore server: closing {}: {}", c->peer, problem);
    }
    close(c, "its proof was malformed");
    return;
  }
  const std::string_view server_nonce(
      reinterpret_cast<const char*>(c->server_nonce.data()),
      c->server_nonce.size());
  const auto expected =
      tcp_store_auth::client_proof(token, c->client_nonce, server_nonce);
  if (!tcp_store_auth::proof_matches(expected, proof.mac.data(),
                                     proof.mac.size())) {
    if (warn_refusal()) {
      COMM_LOG_WARN(
          "TCPStore server: refusing {}: wrong token: its proof does not "
          "match this server's COMM_STORE_TOKEN",
          c->peer);
    }
    refuse(c, proto::HelloStatus::kBadToken);
    return;
  }
  proto::Welcome welcome;
  const auto mine =
      tcp_store_auth::server_proof(token, c->client_nonce, server_nonce);
  welcome.data.assign(mine.begin(), mine.end());
  send(c, proto::encode_welcome(welcome));
  c->challenged = false;
  c->greeted = true;
}

// Sends the refusal's welcome, then closes once it is flushed.
void TCPStoreServer::Impl::refuse(Connection* c, proto::HelloStatus status) {
  proto::Welcome welcome;
  welcome.status = status;
  send(c, proto::encode_welcome(welcome));
  close_after_flush(c);
}

void TCPStoreServer::Impl::handle_request(Connection* c,
                                          proto::Message& request) {
  using proto::Op;
  using proto::Status;
  const auto op = static_cast<Op>(request.code);
  switch (op) {
    case Op::kSet:  // not answered; see the protocol
      table.set(request.keys[0], std::move(request.values[0]));
      key_changed(request.keys[0]);
      return;
    case Op::kGet:
    case Op::kWait: answer_when_ready(c, op, std::move(request.keys)); return;
    case Op::kAdd: {
      std::int64_t sum = 0;
      try {
        sum = table.add(request.keys[0], request.number);
      } catch (const InvalidArgument& e) {
        send_status(c, Status::kError, {to_bytes(e.what())});
        return;
      }
      send_status(c, Status::kOk, {}, sum);
      key_changed(request.keys[0]);
      return;
    }
    case Op::kCompareSet: {
      bool stored = false;
      Bytes now = table.compare_set(request.keys[0], request.values[0],
                                    request.values[1], &stored);
      send_status(c, Status::kOk, {std::move(now)});
      if (stored) key_changed(request.keys[0]);
      return;
    }
    case Op::kCheck:
      send_status(c, Status::kOk, {}, table.contains_all(request.keys) ? 1 : 0);
      return;
    case Op::kDelete:
      send_status(c, Status::kOk, {}, table.erase(request.keys[0]) ? 1 : 0);
      return;
    case Op::kNumKeys: send_status(c, Status::kOk, {}, table.size()); return;
    case Op::kMultiSet:
      for (std::size_t i = 0; i < request.keys.size(); ++i) {
        table.set(request.keys[i], std::move(request.values[i]));
      }
      send_status(c, Status::kOk);
      for (const std::string& key : request.keys) key_changed(key);
      return;
    case Op::kAppend: try { table.append(request.keys[0], request.values[0]);
      } catch (const InvalidArgument& e) {
        send_status(c, Status::kError, {to_bytes(e.what())});
        return;
      }
      send_status(c, Status::kOk);
      key_changed(request.keys[0]);
      return;
    case Op::kCancel: {
      // Answered even without a pending request: the answer to the wait may
      // already be on its way, and the client reads until this one. The
      // answer lists the keys still missing, for the client's message.
      proto::Message canceled;
      canceled.code = static_cast<std::uint8_t>(Status::kCanceled);
      if (c->pending) canceled.keys = table.missing(c->pending_keys);
      forget_pending(c);
      send(c, proto::encode_message(canceled));
      return;
    }
  }
}

void TCPStoreServer::Impl::answer_when_ready(Connection* c, proto::Op op,
                                             std::vector<std::string> keys) {
  c->pending = true;
  c->pending_op = op;
  c->pending_keys = std::move(keys);
  if (table.contains_all(c->pending_keys)) {
    answer_pending(c);
    return;
  }
  for (const std::string& key : c->pending_keys) waiters[key].insert(c);
}

void TCPStoreServer::Impl::answer_pending(Connection* c) {
  std::vector<Bytes> values;
  if (c->pending_op == proto::Op::kGet) {
    // Sized before anything is copied: a get that names large values, or
    // one large value many times, is refused instead of built.
    std::size_t reply = 64;
    for (const std::string& key : c->pending_keys)
      reply += 4 + table.find(key)->size();
    if (reply > proto::kMaxPayload) {
      const std::size_t keys = c->pending_keys.size();
      forget_pending(c);
      send_status(
          c, proto::Status::kError,
          {to_bytes("a get of " + std::to_string(keys) +
                    " keys whose values come to " + std::to_string(reply) +
                    " bytes is over the protocol's limit of " +
                    std::to_string(proto::kMaxPayload) +
                    " bytes per reply; get them in smaller groups")});
      return;
    }
    values.reserve(c->pending_keys.size());
    for (const std::string& key : c->pending_keys)
      values.push_back(*table.find(key));
  }
  forget_pending(c);
  send_status(c, proto::Status::kOk, std::move(values));
}

void TCPStoreServer::Impl::forget_pending(Connection* c) {
  if (!c->pending) return;
  for (const std::string& key : c->pending_keys) {
    auto it = waiters.find(key);
    if (it == waiters.end()) continue;
    it->second.erase(c);
    if (it->second.empty()) waiters.erase(it);
  }
  c->pending = false;
  c->pending_keys.clear();
}

void TCPStoreServer::Impl::key_changed(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  // answer_pending edits `waiters`, so walk a copy.
  const std::vector<Connection*> waiting(it->second.begin(), it->second.end());
  for (Connection* c : waiting) {
    if (c->pending && table.contains_all(c->pending_keys)) answer_pending(c);
  }
}

void TCPStoreServer::Impl::send(Connection* c, Bytes frame) {
  if (c->closing) return;
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->handle);
  std::size_t offset = 0;
  // Most answers are small and the socket has room: write them at once,
  // and queue (with an allocation and a callback) only what is left.
  if (uv_stream_get_write_queue_size(stream) == 0) {
    uv_buf_t whole = uv_buf_init(reinterpret_cast<char*>(frame.data()),
                                 static_cast<unsigned>(frame.size()));
    const int written = uv_try_write(stream, &whole, 1);
    if (written == static_cast<int>(frame.size())) return;
    if (written > 0)
      offset = static_cast<std::size_t>(written);
    else if (written != UV_EAGAIN) {
      close(c, "writing to it failed");
      return;
    }
  }
  auto* write = new WriteRequest;
  frame.erase(frame.begin(),
              frame.begin() + static_cast<std::ptrdiff_t>(offset));
  write->frame = std::move(frame);
  write->connection = c;
  write->request.data = write;
  uv_buf_t buffer = uv_buf_init(reinterpret_cast<char*>(write->frame.data()),
                                static_cast<unsigned>(write->frame.size()));
  const int status =
      uv_write(&write->request, reinterpret_cast<uv_stream_t*>(&c->handle),
               &buffer, 1, on_write);
  if (status != 0) {
    delete write;
    close(c, "writing to it failed");
    return;
  }
  pause_if_backlogged(c);
}

void TCPStoreServer::Impl::on_write(uv_write_t* request, int status) {
  auto* write = static_cast<WriteRequest*>(request->data);
  Connection* c = write->connection;
  delete write;
  Impl* self = c->server;
  if (status != 0 && status != UV_ECANCELED) {
    self->close(c, "writing to it failed");
    return;
  }
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->handle);
  if (!c->paused || c->closing || c->refused ||
      uv_stream_get_write_queue_size(stream) > self->max_queued_bytes / 2) {
    return;
  }
  // Drained to half the bound: handle the requests already received, then
  // read again unless they backed it up once more.
  c->paused = false;
  self->read_frames(c);
  if (!c->paused && !c->closing && !c->refused) {
    uv_read_start(stream, on_alloc, on_read);
  }
}

void TCPStoreServer::Impl::send_status(Connection* c, proto::Status status,
                                       std::vector<Bytes> values,
                                       std::int64_t number) {
  proto::Message response;
  response.code = static_cast<std::uint8_t>(status);
  response.values = std::move(values);
  response.number = number;
  send(c, proto::encode_message(response));
}

void TCPStoreServer::Impl::close(Connection* c, const char* why) {
  if (c->closing) return;
  c->closing = true;
  COMM_LOG_DEBUG("TCPStore server: closing connection from {}: {}", c->peer,
                 why);
  forget_pending(c);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  uv_close(reinterpret_cast<uv_handle_t*>(&c->handle), [](uv_handle_t* handle) {
    auto* closed = static_cast<Connection*>(handle->data);
    Impl* self = closed->server;
    self->connections.erase(closed);
    self->open_connections.store(self->connections.size(),
                                 std::memory_order_relaxed);
    delete closed;
  });
}

// Lets the queued writes (a refusal) reach the client, then closes.
void TCPStoreServer::Impl::close_after_flush(Connection* c) {
  c->refused = true;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  auto* shutdown = new uv_shutdown_t;
  shutdown->data = c;
  const int status =
      uv_shutdown(shutdown, reinterpret_cast<uv_stream_t*>(&c->handle),
                  [](uv_shutdown_t* request, int) {
                    auto* done = static_cast<Connection*>(request->data);
                    delete request;
                    done->server->close(done, "it was refused");
                  });
  if (status != 0) {
    delete shutdown;
    close(c, "it was refused");
  }
}

TCPStoreServer::TCPStoreServer(TCPStoreServerOptions options)
    : impl_(std::make_unique<Impl>(options)) {}

TCPStoreServer::~TCPStoreServer() { stop(); }

std::string TCPStoreServer::environment_token() {
  return kStoreToken.get().value_or("");
}

const std::string& TCPStoreServer::host() const { return impl_->host; }
std::uint16_t TCPStoreServer::port() const { return impl_->port; }
std::size_t TCPStoreServer::connection_count() const {
  return impl_->open_connections.load(std::memory_order_relaxed);
}

bool TCPStoreServer::stop() {
  if (impl_->stopped) return impl_->closed_cleanly;
  impl_->stopped = true;
  uv_async_send(&impl_->stop_signal);
  impl_->thread.join();
  impl_->closed_cleanly = impl_->shut_down_loop();
  return impl_->closed_cleanly;
}

}  // namespace comm
