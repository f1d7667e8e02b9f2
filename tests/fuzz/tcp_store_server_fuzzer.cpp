// libFuzzer target for the TCPStore server itself: each input is what one
// client sends to a live TCPStoreServer over loopback, with the server's
// limits lowered so that a 64 KiB input can reach them (a 4 KiB pre-hello
// frame limit, 64 KiB of queued replies before the server stops reading).
//
// The first byte chooses the set-up: bit 0, the server demands a token;
// bit 1, the harness first completes a real handshake (answering the
// challenge with the right proof when there is a token), so that the rest
// reaches the request parser, the store and the reply limits; without it the
// rest is the hello and proof themselves. The harness sends everything
// before it reads anything, so replies back up and the server's
// back-pressure engages; then it reads until the server closes.
//
// Properties checked besides memory safety: the server never sends a frame
// over the protocol's limit (a get that repeats a large value must be
// refused, not built), every frame it sends after the handshake decodes as
// a response, it closes the connection once the client has closed its side
// (within 10 s: no hang), and it stops cleanly.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libcomm/detail/crypto.h"
#include "libcomm/param.h"
#include "store/tcp_store_auth.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_server.h"

namespace proto = comm::tcp_store_protocol;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kToken = "fuzz-token";

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tcp_store_server_fuzzer: %s\n", what);
  std::abort();
}

int connect_to(std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address),
                        sizeof(address)) != 0) {
    fail("cannot connect to the server");
  }
  // Bounds every blocking send and recv of the harness.
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

void send_all(int fd, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close first: that is its right
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Reads one frame of the handshake; false when the server closed instead.
bool read_frame(int fd, proto::FrameReader& reader) {
  std::uint8_t byte;
  while (true) {
    const auto state = reader.next();
    if (state == proto::FrameReader::State::kFrame) return true;
    if (state == proto::FrameReader::State::kTooLarge)
      fail("the server sent a handshake frame over the limit");
    if (recv(fd, &byte, 1, 0) != 1) return false;
    reader.append(&byte, 1);
  }
}

// The client's side of a correct handshake; false if the server refused.
bool handshake(int fd, bool with_token) {
  proto::Hello hello;
  hello.has_token = with_token;
  hello.client_nonce.fill(0x42);
  const auto frame = proto::encode_hello(hello);
  send_all(fd, frame.data(), frame.size());
  proto::FrameReader reader;
  if (!read_frame(fd, reader)) fail("no welcome to a correct hello");
  proto::Welcome welcome;
  if (!proto::decode_welcome(reader.payload(), reader.payload_size(), &welcome)
           .empty())
    fail("a malformed welcome");
  if (!with_token) return welcome.status == proto::HelloStatus::kOk;
  if (welcome.status != proto::HelloStatus::kChallenge)
    fail("no challenge to a client with a token");
  // A copy: `welcome` is reused for the server's answer below.
  const std::string nonce(welcome.data.begin(), welcome.data.end());
  proto::Proof proof;
  proof.mac =
      comm::tcp_store_auth::client_proof(kToken, hello.client_nonce, nonce);
  const auto proof_frame = proto::encode_proof(proof);
  send_all(fd, proof_frame.data(), proof_frame.size());
  if (!read_frame(fd, reader)) fail("no welcome to a correct proof");
  if (!proto::decode_welcome(reader.payload(), reader.payload_size(), &welcome)
           .empty() ||
      welcome.status != proto::HelloStatus::kOk ||
      !comm::tcp_store_auth::proof_matches(
          comm::tcp_store_auth::server_proof(kToken, hello.client_nonce, nonce),
          welcome.data.data(), welcome.data.size())) {
    fail("a correct proof was not welcomed with the server's own proof");
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("COMM_STORE_HELLO_MAX_BYTES",
         std::to_string(proto::kMaxHelloPayload).c_str(), 1);
  setenv("COMM_STORE_MAX_QUEUED_BYTES", "65536", 1);
  setenv("COMM_STORE_REFUSAL_WARNINGS", "0", 1);
  setenv("COMM_LOG_LEVEL", "off", 1);
  comm::reset_params();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 1) return 0;
  const bool with_token = (data[0] & 1) != 0;
  const bool greet = (data[0] & 2) != 0;
  data += 1;
  size -= 1;

  comm::TCPStoreServerOptions options;
  options.token = with_token ? kToken : "";
  comm::TCPStoreServer server(options);
  const int fd = connect_to(server.port());
  const bool greeted = greet && handshake(fd, with_token);
  send_all(fd, data, size);
  shutdown(fd, SHUT_WR);

  proto::FrameReader reader;
  std::vector<std::uint8_t> chunk(256 << 10);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (true) {
    if (Clock::now() > deadline) fail("the server did not close in 10 s");
    const ssize_t n = recv(fd, chunk.data(), chunk.size(), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        fail("the server did not close in 10 s");
      break;  // reset: the server closed with unread input, which is fine
    }
    reader.append(chunk.data(), static_cast<std::size_t>(n));
    while (true) {
      const auto state = reader.next();
      if (state == proto::FrameReader::State::kNeedMore) break;
      if (state == proto::FrameReader::State::kTooLarge)
        fail("the server sent a frame over the protocol's limit");
      if (!greeted) continue;  // welcomes; the protocol fuzzer reads those
      proto::Message response;
      if (!proto::decode_message(reader.payload(), reader.payload_size(),
                                 &response)
               .empty()) {
        fail("the server sent a response that does not decode");
      }
    }
  }
  close(fd);
  if (!server.stop()) fail("the server did not stop cleanly");
  return 0;
}
