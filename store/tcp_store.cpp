#include "store/tcp_store.h"

#include <cstdlib>

#include "libcomm/detail/crypto.h"
#include "libcomm/detail/log.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "libcomm/version.h"
#include "store/tcp_store_auth.h"
#include "store/tcp_store_protocol.h"

namespace comm {

namespace proto = tcp_store_protocol;

namespace {

proto::Message request_of(proto::Op op, std::vector<std::string> keys = {},
                          std::vector<Bytes> values = {},
                          std::int64_t number = 0) {
  proto::Message message;
  message.code = static_cast<std::uint8_t>(op);
  message.keys = std::move(keys);
  message.values = std::move(values);
  message.number = number;
  return message;
}

}  // namespace

TCPStore::TCPStore(TCPStoreOptions options)
    : Store(options.timeout),
      host_(options.host),
      port_(options.port),
      inbox_(std::make_unique<proto::FrameReader>()) {
  token_ = options.token ? *options.token : TCPStoreServer::environment_token();
  if (token_.size() > proto::kMaxTokenSize) {
    throw InvalidArgument("TCPStore token of " + std::to_string(token_.size()) +
                          " bytes is longer than the limit of " +
                          std::to_string(proto::kMaxTokenSize) +
                          "; shorten COMM_STORE_TOKEN");
  }
  if (options.is_server) {
    TCPStoreServerOptions server_options;
    server_options.host = options.host;
    server_options.port = options.port;
    server_options.token = token_;
    server_ = std::make_unique<TCPStoreServer>(server_options);
    port_ = server_->port();
  }
  name_ = "TCPStore server " + detail::host_port(host_, port_);
  socket_ = std::make_unique<detail::Socket>(detail::Socket::connect(
      host_, port_, detail::deadline_after(options.timeout), "TCPStore"));
  handshake();
}

TCPStore::~TCPStore() {
  // Close our connection before stopping the server we host, so that the
  // server sees an orderly goodbye rather than a reset.
  socket_.reset();
  server_.reset();
}

proto::Welcome TCPStore::read_welcome(detail::Clock::time_point deadline) {
  try {
    read_frame(deadline);
  } catch (const PeerError& e) {
    throw PeerError(-1, std::string(e.what()) +
                            " during the TCPStore handshake; a libcomm "
                            "TCPStore server closes connections it cannot "
                            "hold (past COMM_STORE_MAX_CONNECTIONS or its "
                            "open-file limit; its log says which), or "
                            "something other than a libcomm TCPStore is "
                            "listening there");
  } catch (const TimeoutError& e) {
    // Something accepted the connection but never answered the hello.
    throw TimeoutError(std::string(e.what()) +
                       " during the TCPStore handshake; is something other "
                       "than a libcomm TCPStore listening there?");
  }
  proto::Welcome welcome;
  const std::string problem = proto::decode_welcome(
      inbox_->payload(), inbox_->payload_size(), &welcome);
  if (!problem.empty()) throw PeerError(-1, name_ + ": " + problem);
  return welcome;
}

void TCPStore::throw_bad_token() const {
  throw InvalidArgument(
      name_ +
      " refused this client's token: the server's token (COMM_STORE_TOKEN) "
      "is a different one; set the same COMM_STORE_TOKEN on every rank and "
      "on the server (comm-store, or rank 0 when it hosts the store)");
}

void TCPStore::handshake() {
  proto::Hello hello;
  hello.has_token = !token_.empty();
  hello.client_nonce = detail::random_nonce();
  const Bytes frame = proto::encode_hello(hello);
  const auto deadline = detail::deadline_after(timeout());
  socket_->send_all(frame.data(), frame.size(), deadline, name_);
  const proto::Welcome welcome = read_welcome(deadline);
  switch (welcome.status) {
    case proto::HelloStatus::kOk:
      if (!token_.empty()) {
        // A server that welcomes a client with a token without challenging
        // it has not shown that it knows the token.
        throw PeerError(-1, name_ +
                                " accepted this client without checking its "
                                "token: it is not the server of this job, or "
                                "an impostor; check MASTER_ADDR/MASTER_PORT");
      }
      return;
    case proto::HelloStatus::kChallenge:
      if (token_.empty()) {
        throw PeerError(-1, name_ + " challenged a client that has no token");
      }
      authenticate(hello.client_nonce, welcome.data, deadline);
      return;
    case proto::HelloStatus::kVersionMismatch:
      throw BackendError(name_ + " speaks TCPStore protocol version " +
                         std::to_string(welcome.version) +
                         " but this libcomm (" +
                         std::to_string(COMM_VERSION_MAJOR) + "." +
                         std::to_string(COMM_VERSION_MINOR) + "." +
                         std::to_string(COMM_VERSION_PATCH) + ") speaks " +
                         std::to_string(proto::kVersion) +
                         "; run the same libcomm version on every rank and "
                         "on the server");
    case proto::HelloStatus::kBadToken: throw_bad_token();
    case proto::HelloStatus::kTokenRequired:
      throw InvalidArgument(
          name_ +
          " requires a token and this client has none: set COMM_STORE_TOKEN "
          "to the job's token on every rank (the server's COMM_STORE_TOKEN)");
    case proto::HelloStatus::kTokenNotExpected:
      throw InvalidArgument(
          name_ +
          " has no token, but this client has one (COMM_STORE_TOKEN): set "
          "the same COMM_STORE_TOKEN on the server (comm-store, or rank 0 "
          "when it hosts the store), or unset it on every rank to run "
          "without authentication");
  }
  throw PeerError(-1, name_ + " sent an unknown welcome status");
}

void TCPStore::authenticate(const proto::Nonce& client_nonce,
                            const Bytes& server_nonce,
                            detail::Clock::time_point deadline) {
  const std::string_view server_nonce_text(
      reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  proto::Proof proof;
  proof.mac =
      tcp_store_auth::client_proof(token_, client_nonce, server_nonce_text);
  const Bytes frame = proto::encode_proof(proof);
  socket_->send_all(frame.data(), frame.size(), deadline, name_);
  const proto::Welcome welcome = read_welcome(deadline);
  if (welcome.status == proto::HelloStatus::kBadToken) throw_bad_token();
  const auto expected =
      tcp_store_auth::server_proof(token_, client_nonce, server_nonce_text);
  if (welcome.status != proto::HelloStatus::kOk ||
      !tcp_store_auth::proof_matches(expected, welcome.data.data(),
                                     welcome.data.size())) {
    throw PeerError(-1, name_ +
                            " did not prove that it knows this client's token "
                            "(COMM_STORE_TOKEN): it has another token or is "
                            "not the job's server; check MASTER_ADDR/"
                            "MASTER_PORT and the server's token");
  }
}

void TCPStore::send_request(const proto::Message& request) {
  const Bytes frame = proto::encode_message(request);
  socket_->send_all(frame.data(), frame.size(),
                    detail::deadline_after(timeout()), name_);
}

void TCPStore::read_frame(detail::Clock::time_point deadline) {
  std::uint8_t chunk[16 * 1024];
  // Bounded by the deadline: every round either returns or waits for bytes.
  while (true) {
    const auto state = inbox_->next();
    if (state == proto::FrameReader::State::kFrame) break;
    if (state == proto::FrameReader::State::kTooLarge) {
      throw PeerError(-1, name_ + " sent a frame over the protocol's limit");
    }
    const std::size_t n =
        socket_->recv_some(chunk, sizeof(chunk), deadline, name_);
    inbox_->append(chunk, n);
  }
}

proto::Message TCPStore::read_response() {
  read_frame(detail::deadline_after(timeout()));
  proto::Message response;
  const std::string problem = proto::decode_message(
      inbox_->payload(), inbox_->payload_size(), &response);
  if (!problem.empty()) throw PeerError(-1, name_ + " sent a " + problem);
  return response;
}

proto::Message TCPStore::checked_answer(proto::Message response) {
  if (response.code == static_cast<std::uint8_t>(proto::Status::kError)) {
    throw InvalidArgument(name_ + ": " +
                          (response.values.empty()
                               ? std::string("error")
                               : to_string(response.values[0])));
  }
  if (response.code != static_cast<std::uint8_t>(proto::Status::kOk)) {
    throw PeerError(-1, name_ + " answered with unexpected status " +
                            std::to_string(response.code));
  }
  return response;
}

proto::Message TCPStore::call(const proto::Message& request) {
  if (proto::encoded_size(request) > proto::kMaxPayload) {
    throw InvalidArgument(
        "TCPStore request of " + std::to_string(proto::encoded_size(request)) +
        " bytes is over the limit of " + std::to_string(proto::kMaxPayload) +
        "; split the multi_set");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(request);
  return checked_answer(read_response());
}

proto::Message TCPStore::call_blocking(const proto::Message& request,
                                       Duration timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(request);
  if (socket_->wait_readable(detail::deadline_after(timeout))) {
    return checked_answer(read_response());
  }
  // Cancel, then read until the server confirms. The answer may have been
  // sent just before the cancel arrived: then it comes first, and wins.
  send_request(request_of(proto::Op::kCancel));
  std::optional<proto::Message> answer;
  for (int frames = 0; frames < 2; ++frames) {
    proto::Message response = read_response();
    if (response.code == static_cast<std::uint8_t>(proto::Status::kCanceled)) {
      if (answer) return checked_answer(std::move(*answer));
      throw_store_timeout(
          name_, response.keys.empty() ? request.keys : response.keys, timeout);
    }
    answer = std::move(response);
  }
  throw PeerError(-1, name_ + " did not confirm a canceled wait");
}

void TCPStore::do_set(const std::string& key, const Bytes& value) {
  // The server does not answer a set: one send, and the next request on
  // this connection sees its effect.
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(request_of(proto::Op::kSet, {key}, {value}));
}

Bytes TCPStore::do_get(const std::string& key, Duration timeout) {
  return std::move(do_multi_get({key}, timeout).front());
}

std::int64_t TCPStore::do_add(const std::string& key, std::int64_t delta) {
  return call(request_of(proto::Op::kAdd, {key}, {}, delta)).number;
}

Bytes TCPStore::do_compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  auto response =
      call(request_of(proto::Op::kCompareSet, {key}, {expected, desired}));
  if (response.values.size() != 1) {
    throw PeerError(-1, name_ + " answered compare_set without a value");
  }
  return std::move(response.values[0]);
}

void TCPStore::do_wait(const std::vector<std::string>& keys, Duration timeout) {
  call_blocking(request_of(proto::Op::kWait, keys), timeout);
}

bool TCPStore::do_check(const std::vector<std::string>& keys) {
  return call(request_of(proto::Op::kCheck, keys)).number != 0;
}

bool TCPStore::do_delete_key(const std::string& key) {
  return call(request_of(proto::Op::kDelete, {key})).number != 0;
}

std::int64_t TCPStore::do_num_keys() {
  return call(request_of(proto::Op::kNumKeys)).number;
}

std::vector<Bytes> TCPStore::do_multi_get(const std::vector<std::string>& keys,
                                          Duration timeout) {
  auto response = call_blocking(request_of(proto::Op::kGet, keys), timeout);
  if (response.code != static_cast<std::uint8_t>(proto::Status::kOk) ||
      response.values.size() != keys.size()) {
    throw PeerError(-1, name_ + " answered a get of " +
                            std::to_string(keys.size()) + " keys with " +
                            std::to_string(response.values.size()) + " values");
  }
  return std::move(response.values);
}

void TCPStore::do_multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  call(request_of(proto::Op::kMultiSet, keys, values));
}

Bytes TCPStore::do_derive_key(const std::string& purpose) {
  if (token_.empty()) return {};
  const auto key = detail::derive_key(token_, "store-derived key: " + purpose);
  return Bytes(key.begin(), key.end());
}

void TCPStore::do_append(const std::string& key, const Bytes& value) {
  call(request_of(proto::Op::kAppend, {key}, {value}));
}

}  // namespace comm
