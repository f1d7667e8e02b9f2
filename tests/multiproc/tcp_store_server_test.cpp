// The TCPStore server under hostile and broken clients, across processes:
// whatever one client does, the server keeps serving the others correctly.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"
#include "support/child_process.h"
#include "support/env_is.h"
#include "support/server_process.h"
#include "support/temp_path.h"

namespace proto = comm::tcp_store_protocol;
using comm::testing::ChildProcess;
using comm::testing::EnvIs;
using comm::testing::ServerProcess;
using comm::testing::TempPath;
using namespace std::chrono_literals;

namespace {

comm::TCPStoreOptions client_options(std::uint16_t port,
                                     const char* token = "") {
  comm::TCPStoreOptions options;
  options.port = port;
  options.timeout = 20s;
  options.token = token;
  return options;
}

// A plain blocking socket to the server, for speaking broken protocol.
class RawClient {
 public:
  // Takes over a connected socket (the accepted end of a fake server).
  struct Adopt {
    int fd;
  };
  explicit RawClient(Adopt adopted) : fd_(adopted.fd) {}
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  explicit RawClient(std::uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd_, reinterpret_cast<sockaddr*>(&address),
                    sizeof(address)) == 0);
  }
  ~RawClient() { close(fd_); }
  int fd() const { return fd_; }

  void send_bytes(const std::vector<std::uint8_t>& bytes) {
    // The server may already have closed; that is not this helper's failure.
    (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // A version-2 hello; with `has_token`, the server answers a challenge.
  void hello(bool has_token = false, std::uint16_t version = proto::kVersion) {
    proto::Hello h;
    h.has_token = has_token;
    h.version = version;
    h.client_nonce.fill(0x5a);
    send_bytes(proto::encode_hello(h));
  }
  // Reads one welcome frame.
  proto::Welcome welcome() {
    const std::vector<std::uint8_t> payload = frame();
    proto::Welcome w;
    REQUIRE(proto::decode_welcome(payload.data(), payload.size(), &w) == "");
    return w;
  }
  // Reads one whole frame's payload (or fails the test within 5 s).
  std::vector<std::uint8_t> frame() {
    proto::FrameReader reader;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto state = reader.next();
      REQUIRE(state != proto::FrameReader::State::kTooLarge);
      if (state == proto::FrameReader::State::kFrame) {
        return {reader.payload(), reader.payload() + reader.payload_size()};
      }
      // One byte at a time, so that nothing after this frame is consumed.
      std::uint8_t byte;
      const ssize_t n = recv_within(&byte, 1, 1s);
      if (n == 0) break;
      if (n == 1) reader.append(&byte, 1);
    }
    FAIL("no whole frame from the server within 5 s");
    return {};
  }
  // True when the server closes the connection within `timeout` (reading
  // and discarding whatever it sends first).
  bool closed_by_server(std::chrono::milliseconds timeout) {
    std::uint8_t sink[4096];
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = recv_within(sink, sizeof(sink), 100ms);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN && errno != ETIMEDOUT) return true;  // reset
    }
    return false;
  }

 private:
  ssize_t recv_within(std::uint8_t* buffer, std::size_t size,
                      std::chrono::milliseconds timeout) {
    pollfd entry{fd_, POLLIN, 0};
    if (poll(&entry, 1, static_cast<int>(timeout.count())) <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    return ::recv(fd_, buffer, size, 0);
  }
  int fd_ = -1;
};

// The check every test ends with: a fresh, well-behaved client gets correct
// answers.
void expect_server_healthy(std::uint16_t port) {
  comm::TCPStore store(client_options(port));
  store.set_string("health", "ok");
  CHECK(store.get_string("health") == "ok");
  CHECK(store.add("health-counter", 2) >= 2);
}

void expect_server_healthy_with_token(std::uint16_t port, const char* token) {
  comm::TCPStore store(client_options(port, token));
  store.set_string("health", "ok");
  CHECK(store.get_string("health") == "ok");
}

// The resident memory of a process in bytes, from /proc.
std::size_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return static_cast<std::size_t>(std::stoull(line.substr(6))) * 1024;
    }
  }
  return 0;
}

// Connects a well-behaved client, retrying while the server may still be
// refusing it, and checks that it is served.
void expect_server_admits(std::uint16_t port) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (true) {
    try {
      auto options = client_options(port);
      options.timeout = 2s;
      comm::TCPStore store(options);
      store.set_string("admitted", "yes");
      CHECK(store.get_string("admitted") == "yes");
      return;
    } catch (const comm::Error&) {
      if (std::chrono::steady_clock::now() > deadline) throw;
      std::this_thread::sleep_for(100ms);
    }
  }
}

// A listening socket on 127.0.0.1 for a fake server or a proxy.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) ==
            0);
    REQUIRE(::listen(fd_, 4) == 0);
    socklen_t length = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { close(fd_); }
  std::uint16_t port() const { return port_; }
  // The next connection, or -1 after 10 s.
  int accept_within_10s() {
    pollfd entry{fd_, POLLIN, 0};
    if (poll(&entry, 1, 10000) <= 0) return -1;
    return accept(fd_, nullptr, nullptr);
  }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// A server process whose log (stderr) goes to `log`.
std::unique_ptr<ServerProcess> logged_server(
    const comm::TCPStoreServerOptions& options, const TempPath& log) {
  const int saved = dup(2);
  const int file = open(log.str().c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  REQUIRE(file >= 0);
  dup2(file, 2);
  auto server = std::make_unique<ServerProcess>(options);
  dup2(saved, 2);
  close(saved);
  close(file);
  return server;
}

// The lines of the file at `path` that contain `needle`.
int lines_containing(const TempPath& path, const std::string& needle) {
  std::ifstream in(path.str());
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

std::string file_contents(const TempPath& path) {
  std::ifstream in(path.str(), std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("random bytes close that connection only", "[tcp_store][multiproc]") {
  ServerProcess server;
  comm::TCPStore bystander(client_options(server.port()));
  bystander.set_string("kept", "value");
  std::mt19937 rng(1);
  for (int round = 0; round < 20; ++round) {
    RawClient raw(server.port());
    std::vector<std::uint8_t> noise(1 + rng() % 4096);
    for (auto& byte : noise) byte = static_cast<std::uint8_t>(rng());
    raw.send_bytes(noise);
    // Either the server closed it or is waiting for the rest of a frame;
    // either way the others must be unaffected.
  }
  CHECK(bystander.get_string("kept") == "value");
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("a truncated frame leaves the server serving",
          "[tcp_store][multiproc]") {
  ServerProcess server;
  {
    RawClient raw(server.port());
    raw.hello();
    CHECK(raw.welcome().status == proto::HelloStatus::kOk);
    proto::Message set;
    set.code = static_cast<std::uint8_t>(proto::Op::kSet);
    set.keys = {"k"};
    set.values = {comm::Bytes(1000, 1)};
    auto frame = proto::encode_message(set);
    frame.resize(frame.size() / 2);
    raw.send_bytes(frame);
    expect_server_healthy(server.port());  // while the half frame is pending
  }
  expect_server_healthy(server.port());  // and after its client went away
  comm::TCPStore check(client_options(server.port()));
  CHECK_FALSE(check.check({"k"}));  // the half-sent set had no effect
  CHECK(server.stop() == 0);
}

TEST_CASE("a length of 2^62 is refused without allocating",
          "[tcp_store][multiproc]") {
  ServerProcess server;
  for (bool greeted : {false, true}) {
    RawClient raw(server.port());
    if (greeted) {
      raw.hello();
      CHECK(raw.welcome().status == proto::HelloStatus::kOk);
    }
    std::vector<std::uint8_t> length(8, 0);
    length[7] = 0x40;  // 2^62, little-endian
    raw.send_bytes(length);
    CHECK(raw.closed_by_server(5s));
  }
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("a malformed request closes that connection",
          "[tcp_store][multiproc]") {
  ServerProcess server;
  RawClient raw(server.port());
  raw.hello();
  CHECK(raw.welcome().status == proto::HelloStatus::kOk);
  proto::Message bad;
  bad.code = static_cast<std::uint8_t>(proto::Op::kCompareSet);
  bad.keys = {"k"};  // compare_set needs two values
  raw.send_bytes(proto::encode_message(bad));
  CHECK(raw.closed_by_server(5s));
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("a wait in one process wakes on a set from another",
          "[tcp_store][multiproc]") {
  ServerProcess server;
  ChildProcess waiter([&] {
    comm::TCPStore store(client_options(server.port()));
    return store.get_string("wake", 20s) == "now" ? 0 : 1;
  });
  ChildProcess setter([&] {
    std::this_thread::sleep_for(200ms);
    comm::TCPStore store(client_options(server.port()));
    store.set_string("wake", "now");
    return 0;
  });
  CHECK(setter.wait(20s) == 0);
  CHECK(waiter.wait(20s) == 0);
  CHECK(server.stop() == 0);
}

TEST_CASE("a client killed in the middle of a wait", "[tcp_store][multiproc]") {
  ServerProcess server;
  ChildProcess doomed([&] {
    comm::TCPStore store(client_options(server.port()));
    store.set_string("doomed-waiting", "1");
    store.wait({"never"}, 60s);
    return 0;
  });
  comm::TCPStore store(client_options(server.port()));
  store.wait({"doomed-waiting"}, 20s);
  doomed.kill(SIGKILL);
  CHECK(doomed.wait(10s) == 128 + SIGKILL);
  // Setting the key the dead client waited for must not touch its closed
  // connection, and the server goes on.
  store.set_string("never", "set after all");
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("1,000 connect/disconnect cycles", "[tcp_store][multiproc]") {
  ServerProcess server;
  for (int cycle = 0; cycle < 1000; ++cycle) {
    if (cycle % 2 == 0) {
      comm::TCPStore store(client_options(server.port()));
    } else {
      RawClient raw(server.port());  // gone before saying hello
    }
  }
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("a wrong or missing token is refused", "[tcp_store][multiproc]") {
  comm::TCPStoreServerOptions options;
  options.token = "job-secret";
  ServerProcess server(options);
  CHECK_THROWS_WITH(comm::TCPStore(client_options(server.port(), "guess")),
                    Catch::Contains("refused this client's token") &&
                        Catch::Contains("different one") &&
                        Catch::Contains("COMM_STORE_TOKEN"));
  CHECK_THROWS_WITH(comm::TCPStore(client_options(server.port(), "")),
                    Catch::Contains("requires a token and this client has "
                                    "none") &&
                        Catch::Contains("COMM_STORE_TOKEN"));
  comm::TCPStore member(client_options(server.port(), "job-secret"));
  member.set_string("in", "yes");
  CHECK(member.get_string("in") == "yes");
  CHECK(server.stop() == 0);
}

TEST_CASE("a protocol version mismatch is clear on both sides",
          "[tcp_store][multiproc]") {
  ServerProcess server;
  {
    RawClient future(server.port());
    future.hello(false, proto::kVersion + 1);
    const proto::Welcome welcome = future.welcome();
    CHECK(welcome.status == proto::HelloStatus::kVersionMismatch);
    CHECK(welcome.version == proto::kVersion);
    CHECK(future.closed_by_server(5s));
  }
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);

  // The client's side: a fake server that answers every hello with a
  // mismatch from version 7.
  Listener listener;
  ChildProcess fake([&] {
    const int client = listener.accept_within_10s();
    std::uint8_t hello[256];
    (void)recv(client, hello, sizeof(hello), 0);
    proto::Welcome w;
    w.version = 7;
    w.status = proto::HelloStatus::kVersionMismatch;
    const auto frame = proto::encode_welcome(w);
    (void)send(client, frame.data(), frame.size(), 0);
    close(client);
    return 0;
  });
  CHECK_THROWS_WITH(
      comm::TCPStore(client_options(listener.port())),
      Catch::Contains("version 7") && Catch::Contains("same libcomm"));
  CHECK(fake.wait(10s) == 0);
}

TEST_CASE("connecting to nothing times out naming host and port",
          "[tcp_store][multiproc]") {
  // A port that was just free: nobody listens there.
  const std::uint16_t port = comm::detail::free_loopback_port();
  auto options = client_options(port);
  options.timeout = 500ms;
  CHECK_THROWS_WITH(comm::TCPStore(options),
                    Catch::Contains("127.0.0.1:" + std::to_string(port)) &&
                        Catch::Contains("attempts"));
}

TEST_CASE("a listener that never answers the hello is named as a stranger",
          "[tcp_store][multiproc]") {
  // The kernel accepts the connection (the backlog) and nothing answers:
  // another program holds the port.
  const Listener listener;
  auto options = client_options(listener.port());
  options.timeout = 500ms;
  CHECK_THROWS_AS(comm::TCPStore(options), comm::TimeoutError);
  CHECK_THROWS_WITH(comm::TCPStore(options),
                    Catch::Contains("during the TCPStore handshake; is "
                                    "something other than a libcomm "
                                    "TCPStore listening there?"));
}

TEST_CASE("a 64 MiB hello is refused before anything is allocated for it",
          "[tcp_store][multiproc][limits]") {
  ServerProcess server;
  expect_server_healthy(server.port());
  const std::size_t before = resident_bytes(server.process().pid());
  {
    RawClient raw(server.port());
    std::vector<std::uint8_t> frame(proto::kLengthSize + (16 << 20), 0xab);
    const std::uint64_t length = 64 << 20;
    for (std::size_t i = 0; i < proto::kLengthSize; ++i)
      frame[i] = static_cast<std::uint8_t>(length >> (8 * i));
    // A quarter of the announced hello; the server must not wait for the
    // rest, and must not have buffered what it got.
    raw.send_bytes(frame);
    CHECK(raw.closed_by_server(5s));
  }
  expect_server_healthy(server.port());
  CHECK(resident_bytes(server.process().pid()) < before + (4 << 20));
  CHECK(server.stop() == 0);
}

TEST_CASE("connections silent past the hello deadline are closed",
          "[tcp_store][multiproc][limits]") {
  EnvIs environment({{"COMM_STORE_HELLO_TIMEOUT_S", "1"}});
  ServerProcess server;
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 3; ++i)
    silent.push_back(std::make_unique<RawClient>(server.port()));
  RawClient partial(server.port());
  partial.send_bytes({1, 2, 3});  // the start of a length, never finished
  RawClient greeted(server.port());
  greeted.hello();
  CHECK(greeted.welcome().status == proto::HelloStatus::kOk);
  const auto start = std::chrono::steady_clock::now();
  for (auto& raw : silent) CHECK(raw->closed_by_server(5s));
  CHECK(partial.closed_by_server(5s));
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  // The deadline is for the hello only: a greeted client may stay idle.
  CHECK_FALSE(greeted.closed_by_server(1500ms));
  expect_server_healthy(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("connections over the cap are closed at once",
          "[tcp_store][multiproc][limits]") {
  EnvIs environment({{"COMM_STORE_MAX_CONNECTIONS", "4"}});
  ServerProcess server;
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawClient>(server.port()));
    held.back()->hello();
    CHECK(held.back()->welcome().status == proto::HelloStatus::kOk);
  }
  RawClient over(server.port());
  over.hello();
  CHECK(over.closed_by_server(5s));
  // A real client cannot get in either, until one of the others leaves.
  auto options = client_options(server.port());
  options.timeout = 1s;
  CHECK_THROWS(comm::TCPStore(options));
  held.pop_back();
  expect_server_admits(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("a server raises its soft open-file limit as clients come",
          "[tcp_store][multiproc][limits]") {
  // The server's process starts with a soft limit of 100 (its hard limit
  // stays), and 300 clients connect and stay.
  rlimit files{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
  if (files.rlim_max != RLIM_INFINITY && files.rlim_max < 1024) {
    WARN("SKIPPED: the hard open-file limit, "
         << files.rlim_max << ", is below this test's 1024");
    return;
  }
  const rlimit low{100, files.rlim_max};
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  ServerProcess server;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &files) == 0);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 300; ++i) {
    held.push_back(std::make_unique<RawClient>(server.port()));
    held.back()->hello();
    INFO("client " << i);
    REQUIRE(held.back()->welcome().status == proto::HelloStatus::kOk);
  }
  held.clear();
  expect_server_admits(server.port());
  CHECK(server.stop() == 0);
}

TEST_CASE("a client that never reads its replies is not read either",
          "[tcp_store][multiproc][limits]") {
  ServerProcess server;
  constexpr std::size_t kValueSize = 256 << 10;
  constexpr int kGets = 1000;
  {
    comm::TCPStore store(client_options(server.port()));
    store.set("big", comm::Bytes(kValueSize, 7));
  }
  const std::size_t before = resident_bytes(server.process().pid());
  RawClient greedy(server.port());
  greedy.hello();
  CHECK(greedy.welcome().status == proto::HelloStatus::kOk);
  proto::Message get;
  get.code = static_cast<std::uint8_t>(proto::Op::kGet);
  get.keys = {"big"};
  const comm::Bytes one = proto::encode_message(get);
  comm::Bytes gets;
  for (int i = 0; i < kGets; ++i)
    gets.insert(gets.end(), one.begin(), one.end());
  greedy.send_bytes(gets);  // small enough for the socket buffers
  // Unbounded, the server would queue kGets * kValueSize = 250 MiB.
  std::this_thread::sleep_for(1s);
  expect_server_healthy(server.port());
  CHECK(resident_bytes(server.process().pid()) < before + (48 << 20));
  // Once the client reads, every get is answered.
  proto::Message reply;
  reply.values = {comm::Bytes(kValueSize, 7)};
  const std::size_t expected =
      static_cast<std::size_t>(kGets) * proto::encode_message(reply).size();
  std::size_t received = 0;
  std::vector<std::uint8_t> sink(1 << 20);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (received < expected && std::chrono::steady_clock::now() < deadline) {
    pollfd entry{greedy.fd(), POLLIN, 0};
    if (poll(&entry, 1, 1000) <= 0) continue;
    const ssize_t n = recv(greedy.fd(), sink.data(), sink.size(), 0);
    if (n <= 0) break;
    received += static_cast<std::size_t>(n);
  }
  CHECK(received == expected);
  CHECK(server.stop() == 0);
}

TEST_CASE("warnings about refused clients are rate-limited",
          "[tcp_store][multiproc][limits]") {
  EnvIs environment({{"COMM_STORE_REFUSAL_WARNINGS", "5"}});
  TempPath log("tcp_store_refusals");
  comm::TCPStoreServerOptions options;
  options.token = "job-secret";
  auto server = logged_server(options, log);
  for (int i = 0; i < 200; ++i) {
    RawClient raw(server->port());
    raw.hello(true);
    CHECK(raw.welcome().status == proto::HelloStatus::kChallenge);
    proto::Proof guess;
    guess.mac.fill(static_cast<std::uint8_t>(i));
    raw.send_bytes(proto::encode_proof(guess));
    CHECK(raw.welcome().status == proto::HelloStatus::kBadToken);
  }
  // The count of the suppressed ones appears when the interval ends, even
  // with no further refusal.
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  while (lines_containing(log, "suppressed") == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(200ms);
  // Five per interval; the 200 refusals take one interval, or two on a
  // slow machine.
  CHECK(lines_containing(log, "wrong token") >= 5);
  CHECK(lines_containing(log, "wrong token") <= 10);
  CHECK(lines_containing(
            log, "more warnings about refused clients were suppressed") >= 1);
  CHECK(server->stop() == 0);
}

// The frames a client sends, seen by a fake server that plays the server's
// part of the handshake: the token must appear in none of them.
TEST_CASE("the token never crosses the wire", "[tcp_store][multiproc][auth]") {
  const std::string token = "sekret-token-that-must-stay-home";
  // Two fakes: one that challenges and then gives a bogus proof of its
  // own, one that welcomes a client with a token without a challenge. The
  // client must refuse both, and send the token to neither.
  for (const bool challenges : {true, false}) {
    INFO("the fake server " << (challenges ? "challenges" : "does not"));
    Listener listener;
    TempPath capture("tcp_store_capture");
    ChildProcess fake([&] {
      RawClient client(RawClient::Adopt{listener.accept_within_10s()});
      std::ofstream out(capture.str(), std::ios::binary);
      auto record = [&](const std::vector<std::uint8_t>& payload) {
        out.write(reinterpret_cast<const char*>(payload.data()),
                  static_cast<std::streamsize>(payload.size()));
        out.flush();
      };
      record(client.frame());  // the hello
      proto::Welcome welcome;
      if (challenges) {
        welcome.status = proto::HelloStatus::kChallenge;
        welcome.data.assign(proto::kNonceSize, 0x11);
        client.send_bytes(proto::encode_welcome(welcome));
        record(client.frame());  // the proof
        welcome.status = proto::HelloStatus::kOk;
        welcome.data.assign(proto::kProofSize, 0);  // not the real proof
      }
      client.send_bytes(proto::encode_welcome(welcome));
      // Whatever else the client sends before it gives up.
      std::vector<std::uint8_t> rest(4096);
      pollfd entry{client.fd(), POLLIN, 0};
      while (poll(&entry, 1, 5000) > 0) {
        const ssize_t n = recv(client.fd(), rest.data(), rest.size(), 0);
        if (n <= 0) break;
        record({rest.begin(), rest.begin() + n});
      }
      return 0;
    });
    auto options = client_options(listener.port(), token.c_str());
    options.timeout = 10s;
    if (challenges) {
      CHECK_THROWS_WITH(comm::TCPStore(options),
                        Catch::Contains("did not prove that it knows") &&
                            Catch::Contains("COMM_STORE_TOKEN"));
    } else {
      CHECK_THROWS_WITH(comm::TCPStore(options),
                        Catch::Contains("without checking its token"));
    }
    CHECK(fake.wait(15s) == 0);
    const std::string sent = file_contents(capture);
    // The hello (magic, version, token flag and nonce), then the proof.
    CHECK(sent.size() == (challenges ? 4 + 2 + 4 + 33 + 4 + 4 + 32 : 43u));
    CHECK(sent.find(token) == std::string::npos);
    CHECK(sent.find(token.substr(0, 8)) == std::string::npos);
  }
}

TEST_CASE("token and no token: each combination says what is wrong",
          "[tcp_store][multiproc][auth]") {
  struct Case {
    const char* server;
    const char* client;
    const char* client_message;  // nullptr: admitted
    const char* server_log;
  };
  const Case cases[] = {
      {"", "", nullptr, nullptr},
      {"job-secret", "job-secret", nullptr, nullptr},
      {"job-secret", "guess",
       "the server's token (COMM_STORE_TOKEN) is a "
       "different one",
       "wrong token: its proof does not match this server's COMM_STORE_TOKEN"},
      {"job-secret", "", "requires a token and this client has none",
       "missing token: this server requires one (COMM_STORE_TOKEN) and the "
       "client has none"},
      {"", "job-secret", "has no token, but this client has one",
       "unexpected token: the client has a token but this server has none"},
  };
  for (const Case& c : cases) {
    INFO("server token '" << c.server << "', client token '" << c.client
                          << "'");
    TempPath log("tcp_store_token_log");
    comm::TCPStoreServerOptions options;
    options.token = c.server;
    auto server = logged_server(options, log);
    if (c.client_message == nullptr) {
      comm::TCPStore store(client_options(server->port(), c.client));
      store.set_string("in", "yes");
      CHECK(store.get_string("in") == "yes");
    } else {
      CHECK_THROWS_WITH(
          comm::TCPStore(client_options(server->port(), c.client)),
          Catch::Contains(c.client_message) &&
              Catch::Contains("COMM_STORE_TOKEN"));
    }
    CHECK(server->stop() == 0);
    if (c.server_log != nullptr) {
      CHECK(lines_containing(log, c.server_log) == 1);
    } else {
      CHECK(lines_containing(log, "refusing") == 0);
    }
  }
}

// A real client authenticates through a proxy that records what it sends;
// the recording, replayed on a new connection, must not get in.
TEST_CASE("a recorded handshake cannot be replayed",
          "[tcp_store][multiproc][auth]") {
  comm::TCPStoreServerOptions options;
  options.token = "job-secret";
  ServerProcess server(options);
  Listener proxy;
  ChildProcess member([&] {
    comm::TCPStore store(client_options(proxy.port(), "job-secret"));
    store.set_string("k", "v");
    return store.get_string("k") == "v" ? 0 : 1;
  });
  const int downstream = proxy.accept_within_10s();
  REQUIRE(downstream >= 0);
  RawClient upstream(server.port());
  std::vector<std::uint8_t> sent;      // client to server
  std::vector<std::uint8_t> answered;  // server to client
  {
    std::vector<std::uint8_t> chunk(64 << 10);
    bool down_open = true;
    bool up_open = true;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while ((down_open || up_open) &&
           std::chrono::steady_clock::now() < deadline) {
      pollfd entries[2] = {
          {downstream, static_cast<short>(down_open ? POLLIN : 0), 0},
          {upstream.fd(), static_cast<short>(up_open ? POLLIN : 0), 0}};
      if (poll(entries, 2, 1000) <= 0) continue;
      for (int side = 0; side < 2; ++side) {
        if (entries[side].revents == 0) continue;
        const int from = side == 0 ? downstream : upstream.fd();
        const int to = side == 0 ? upstream.fd() : downstream;
        const ssize_t n = recv(from, chunk.data(), chunk.size(), 0);
        if (n <= 0) {
          (side == 0 ? down_open : up_open) = false;
          shutdown(to, SHUT_WR);
          continue;
        }
        auto& log = side == 0 ? sent : answered;
        log.insert(log.end(), chunk.begin(), chunk.begin() + n);
        REQUIRE(::send(to, chunk.data(), static_cast<std::size_t>(n),
                       MSG_NOSIGNAL) == n);
      }
    }
  }
  close(downstream);
  REQUIRE(member.wait(10s) == 0);  // the real client got in and was served

  // The client's first two frames: its hello and its proof.
  auto frame_at = [&](std::size_t offset) {
    REQUIRE(sent.size() >= offset + proto::kLengthSize);
    std::uint64_t length = 0;
    for (std::size_t i = 0; i < proto::kLengthSize; ++i)
      length |= static_cast<std::uint64_t>(sent[offset + i]) << (8 * i);
    REQUIRE(sent.size() >= offset + proto::kLengthSize + length);
    return std::vector<std::uint8_t>(
        sent.begin() + static_cast<std::ptrdiff_t>(offset),
        sent.begin() +
            static_cast<std::ptrdiff_t>(offset + proto::kLengthSize + length));
  };
  const auto hello = frame_at(0);
  const auto proof = frame_at(hello.size());
  RawClient replay(server.port());
  replay.send_bytes(hello);
  const proto::Welcome challenge = replay.welcome();
  REQUIRE(challenge.status == proto::HelloStatus::kChallenge);
  // A fresh nonce: not the one the recorded proof answers.
  const std::string answered_text(answered.begin(), answered.end());
  CHECK(answered_text.find(
            std::string(challenge.data.begin(), challenge.data.end())) ==
        std::string::npos);
  replay.send_bytes(proof);
  CHECK(replay.welcome().status == proto::HelloStatus::kBadToken);
  CHECK(replay.closed_by_server(5s));
  expect_server_healthy_with_token(server.port(), "job-secret");
  CHECK(server.stop() == 0);
}
