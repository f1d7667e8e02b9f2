// comm::tcp::Mesh: the TCP backend's connections, three channels to every
// other rank, set up through a Store. Ranks run as threads over one
// HashStore; Catch2's assertions are not thread-safe, so the ranks' threads
// throw what they find and the test's thread checks it.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/tcp/mesh.h"
#include "libcomm/detail/crypto.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/store_barrier.h"
#include "store/tcp_store.h"
#include "support/keyed_store.h"
#include "support/mesh_ranks.h"
#include "support/rank_checks.h"

using comm::HashStore;
using comm::tcp::Channel;
using comm::tcp::Mesh;
using comm::tcp::Route;
using comm::tcp::route_between;
using comm::testing::check_all_ok;
using comm::testing::expect;
using comm::testing::run_meshes;
using namespace std::chrono_literals;

namespace {

// The handshake a connecting rank sends first (see rank_handshake.h): magic
// "CMT2", channel, version 4, whether it authenticates, a reserved byte,
// job id, rank, world size, nonce.
struct Hello {
  std::uint32_t magic = 0x32544d43;
  std::uint8_t channel = 0;
  std::uint8_t version = 4;
  std::uint8_t authenticated = 0;
  std::uint8_t reserved = 0;
  std::uint64_t job = 0;
  std::int32_t rank = 0;
  std::int32_t size = 0;
  std::uint8_t nonce[32] = {};
};
static_assert(sizeof(Hello) == 56);

// libcomm 0.1's whole handshake: magic "CMTH", channel, three reserved
// bytes, job id, rank, world size; no authentication.
struct OldHello {
  std::uint32_t magic = 0x48544d43;
  std::uint8_t channel = 0;
  std::uint8_t reserved[3] = {};
  std::uint64_t job = 0;
  std::int32_t rank = 0;
  std::int32_t size = 0;
};
static_assert(sizeof(OldHello) == 24);

// Arrives at the set-up's first barrier as rank 1 of 2, as a stranger who
// reads the store must before rank 0 listens.
void arrive_as_rank1(comm::Store& store) {
  const comm::StoreBarrier started{store, "tcp/started/", 1, 2,
                                   "the test's rank 1"};
  REQUIRE(comm::arrive_and_wait(started, 10s) == "");
}

comm::detail::Socket connect_to_rank0(
    comm::Store& store, comm::detail::Clock::time_point deadline) {
  const std::string address = store.get_string("tcp/addr/0", 10s);
  const auto colon = address.rfind(':');
  return comm::detail::Socket::connect(
      address.substr(0, colon),
      static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))),
      deadline, "rank 0");
}

// Connects to rank 0's published address, sends `hello` and returns the
// one-byte answer (1: accepted, 0: refused, 2: a challenge), or -1 when the
// connection closed first. With `proof`, answers a challenge with it and
// returns the answer to that.
template <typename H>
int knock(comm::Store& store, const H& hello,
          const std::vector<std::uint8_t>* proof = nullptr) {
  const auto deadline = comm::detail::deadline_after(10s);
  auto socket = connect_to_rank0(store, deadline);
  socket.send_all(&hello, sizeof(hello), deadline, "rank 0");
  std::uint8_t answer = 0;
  try {
    socket.recv_all(&answer, 1, deadline, "rank 0");
    if (answer == 2 && proof != nullptr) {
      std::uint8_t nonce[32];
      socket.recv_all(nonce, sizeof(nonce), deadline, "rank 0");
      socket.send_all(proof->data(), proof->size(), deadline, "rank 0");
      socket.recv_all(&answer, 1, deadline, "rank 0");
    }
  } catch (const comm::PeerError&) {
    return -1;
  }
  return answer;
}

}  // namespace

TEST_CASE("every pair of ranks gets one connection per channel",
          "[tcp][mesh]") {
  constexpr int kWorld = 4;
  // Each rank sends (its rank, the channel) to every peer on every channel,
  // then reads what came in: each pair must come from the peer and channel
  // it was read on.
  auto errors = run_meshes(kWorld, 10s, [](Mesh& mesh) {
    expect(mesh.size() == kWorld, "size()");
    const auto deadline = comm::detail::deadline_after(10s);
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == mesh.rank()) continue;
      expect(
          mesh.peer_name(peer).starts_with("rank " + std::to_string(peer)),
          "peer_name(" + std::to_string(peer) + ") is " + mesh.peer_name(peer));
      for (int channel = 0; channel < comm::tcp::kChannels; ++channel) {
        auto& socket = mesh.socket(peer, static_cast<Channel>(channel));
        expect(socket.valid(), "no socket to rank " + std::to_string(peer));
        const std::uint8_t mine[2] = {static_cast<std::uint8_t>(mesh.rank()),
                                      static_cast<std::uint8_t>(channel)};
        socket.send_all(mine, 2, deadline, mesh.peer_name(peer), peer);
      }
    }
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == mesh.rank()) continue;
      for (int channel = 0; channel < comm::tcp::kChannels; ++channel) {
        std::uint8_t theirs[2] = {};
        mesh.socket(peer, static_cast<Channel>(channel))
            .recv_all(theirs, 2, deadline, mesh.peer_name(peer), peer);
        expect(theirs[0] == peer && theirs[1] == channel,
               "channel " + std::to_string(channel) + " from rank " +
                   std::to_string(peer) + " carried rank " +
                   std::to_string(theirs[0]) + "'s channel " +
                   std::to_string(theirs[1]));
      }
    }
  });
  check_all_ok(errors);
}

TEST_CASE("a world of one connects to no one", "[tcp][mesh]") {
  auto errors = run_meshes(1, 10s, [](Mesh& mesh) {
    expect(mesh.rank() == 0 && mesh.size() == 1, "rank() or size()");
  });
  CHECK(errors[0] == "");
}

TEST_CASE("a connection whose handshake does not fit the group is refused",
          "[tcp][mesh]") {
  HashStore store(20s);
  // Rank 0 waits for rank 1; strangers knock first, each refused with a 0,
  // and only then does the real rank 1 come.
  std::vector<std::string> rank0_errors;
  std::thread rank0(
      [&] { rank0_errors = run_meshes(store, 2, {0}, 20s, [](Mesh&) {}); });
  const std::uint64_t job = std::stoull(store.get_string("tcp/job", 10s));
  arrive_as_rank1(store);
  // Rank 1's own handshake, but for one field.
  auto but = [job](auto change) {
    Hello hello;
    hello.job = job;
    hello.rank = 1;
    hello.size = 2;
    change(hello);
    return hello;
  };
  const std::pair<const char*, Hello> strangers[] = {
      {"a stale job", but([&](Hello& h) { h.job = job + 1; })},
      {"another world size", but([](Hello& h) { h.size = 3; })},
      {"rank 0's own rank", but([](Hello& h) { h.rank = 0; })},
      {"a wrong magic", but([](Hello& h) { h.magic = 0x12345678; })},
      {"no such channel",
       but([](Hello& h) { h.channel = comm::tcp::kChannels; })},
      {"another version", but([](Hello& h) { h.version = 3; })},
      // Without a token in the store there is nothing to authenticate with.
      {"authentication", but([](Hello& h) { h.authenticated = 1; })},
  };
  for (const auto& [what, hello] : strangers) {
    INFO("a handshake with " << what);
    CHECK(knock(store, hello) == 0);
  }
  OldHello old;
  old.job = job;
  old.rank = 1;
  old.size = 2;
  CHECK(knock(store, old) == 0);

  auto errors = run_meshes(store, 2, {1}, 20s, [](Mesh&) {});
  rank0.join();
  CHECK(errors[1] == "");
  CHECK(rank0_errors[0] == "");
}

TEST_CASE("a rank that never comes is named in a TimeoutError", "[tcp][mesh]") {
  HashStore store(10s);
  // Rank 2 never starts: ranks 0 and 1 wait for it at the set-up's first
  // barrier until their timeout.
  auto errors = run_meshes(store, 3, {0, 1}, 1s, [](Mesh&) {
    throw std::runtime_error("a mesh without rank 2 was built");
  });
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    CHECK_THAT(errors[static_cast<std::size_t>(rank)],
               Catch::Contains("TCP backend set-up timed out after") &&
                   Catch::Contains("2 of 3 ranks arrived; missing rank 2"));
  }
}

// The bytes of a test that sends the mesh's own exchange over every pair and
// channel (as the first test), for the authenticated meshes below.
void exchange_on_every_channel(Mesh& mesh) {
  const auto deadline = comm::detail::deadline_after(10s);
  for (int peer = 0; peer < mesh.size(); ++peer) {
    if (peer == mesh.rank()) continue;
    for (int channel = 0; channel < comm::tcp::kChannels; ++channel) {
      const std::uint8_t mine[2] = {static_cast<std::uint8_t>(mesh.rank()),
                                    static_cast<std::uint8_t>(channel)};
      mesh.socket(peer, static_cast<Channel>(channel))
          .send_all(mine, 2, deadline, mesh.peer_name(peer), peer);
    }
  }
  for (int peer = 0; peer < mesh.size(); ++peer) {
    if (peer == mesh.rank()) continue;
    for (int channel = 0; channel < comm::tcp::kChannels; ++channel) {
      std::uint8_t theirs[2] = {};
      mesh.socket(peer, static_cast<Channel>(channel))
          .recv_all(theirs, 2, deadline, mesh.peer_name(peer), peer);
      expect(theirs[0] == peer && theirs[1] == channel, "wrong bytes");
    }
  }
}

TEST_CASE("over a TCPStore with a token, rank connections authenticate",
          "[tcp][mesh][auth]") {
  constexpr int kWorld = 4;
  comm::TCPStoreOptions options;
  options.port = 0;
  options.is_server = true;
  options.timeout = 20s;
  options.token = "job-secret";
  // One client per rank, as in a job: a TCPStore serves one call at a time.
  std::vector<std::shared_ptr<comm::Store>> clients;
  clients.push_back(std::make_shared<comm::TCPStore>(options));
  options.is_server = false;
  options.port = static_cast<comm::TCPStore&>(*clients[0]).port();
  for (int rank = 1; rank < kWorld; ++rank)
    clients.push_back(std::make_shared<comm::TCPStore>(options));
  REQUIRE(clients[0]->derive_key("purpose").size() == 32);
  CHECK(clients[1]->derive_key("purpose") == clients[0]->derive_key("purpose"));
  // Each subgroup's prefix has keys of its own.
  std::vector<std::unique_ptr<comm::PrefixStore>> group;
  for (auto& client : clients)
    group.push_back(std::make_unique<comm::PrefixStore>("group0", client));
  CHECK(group[0]->derive_key("purpose") != clients[0]->derive_key("purpose"));
  CHECK(group[0]->derive_key("purpose") == group[1]->derive_key("purpose"));
  CHECK(comm::PrefixStore("group1", clients[0]).derive_key("purpose") !=
        group[0]->derive_key("purpose"));
  auto errors = run_meshes(
      [&](int rank) -> comm::Store& {
        return *group[static_cast<std::size_t>(rank)];
      },
      kWorld, {0, 1, 2, 3}, 20s, exchange_on_every_channel);
  check_all_ok(errors);
}

TEST_CASE("with a token, a connection without the job's key is refused",
          "[tcp][mesh][auth]") {
  HashStore keys(20s);
  comm::testing::KeyedStore store(keys, "job-secret");
  std::vector<std::string> rank0_errors;
  std::thread rank0([&] {
    rank0_errors = run_meshes(store, 2, {0}, 20s, exchange_on_every_channel);
  });
  // A stranger who read the job id (from a store without a token, or off
  // the network) but does not hold the key.
  const std::uint64_t job = std::stoull(store.get_string("tcp/job", 10s));
  arrive_as_rank1(store);
  OldHello old;
  old.job = job;
  old.rank = 1;
  old.size = 2;
  CHECK(knock(store, old) == 0);
  Hello right;
  right.job = job;
  right.rank = 1;
  right.size = 2;
  CHECK(knock(store, right) == 0);  // does not offer to authenticate
  right.authenticated = 1;
  const std::vector<std::uint8_t> zeros(32, 0);
  CHECK(knock(store, right, &zeros) == 0);  // challenged; a wrong proof
  // A MAC under a key derived from another secret is just as wrong.
  const auto other = comm::detail::derive_key(
      "guess", "tcp backend rank connections/job " + std::to_string(job));
  const auto forged = comm::detail::hmac_sha256(other, {"connector"});
  const std::vector<std::uint8_t> forged_bytes(forged.begin(), forged.end());
  CHECK(knock(store, right, &forged_bytes) == 0);

  auto errors = run_meshes(store, 2, {1}, 20s, exchange_on_every_channel);
  rank0.join();
  CHECK(errors[1] == "");
  CHECK(rank0_errors[0] == "");
}

TEST_CASE("ranks whose tokens differ do not connect", "[tcp][mesh][auth]") {
  HashStore keys(20s);
  comm::testing::KeyedStore right(keys, "job-secret");
  comm::testing::KeyedStore wrong(keys, "another-secret");
  auto errors = run_meshes(
      [&](int rank) -> comm::Store& { return rank == 0 ? right : wrong; }, 2,
      {0, 1}, 10s, [](Mesh&) { throw std::runtime_error("connected"); });
  CHECK_THAT(errors[1], Catch::Contains("refused our proof") &&
                            Catch::Contains("COMM_STORE_TOKEN"));
  // Rank 0 hears rank 1's reason through the set-up's last barrier, long
  // before its deadline.
  CHECK_THAT(errors[0], Catch::Contains("another rank failed") &&
                            Catch::Contains("COMM_STORE_TOKEN"));
}

namespace {

sockaddr_storage address_of(const char* text) {
  sockaddr_storage address{};
  if (inet_pton(AF_INET, text,
                &reinterpret_cast<sockaddr_in&>(address).sin_addr) == 1) {
    address.ss_family = AF_INET;
  } else {
    REQUIRE(inet_pton(AF_INET6, text,
                      &reinterpret_cast<sockaddr_in6&>(address).sin6_addr) ==
            1);
    address.ss_family = AF_INET6;
  }
  return address;
}

Route route(const char* mine, const char* theirs, bool same_kernel) {
  return route_between(address_of(mine), address_of(theirs), same_kernel);
}

}  // namespace

TEST_CASE("a connection's route: loopback, another namespace, the network",
          "[mesh]") {
  // A loopback peer, or one at this end's own address, is in this
  // namespace, whatever the boot ids say.
  for (bool same_kernel : {true, false}) {
    CHECK(route("127.0.0.1", "127.0.0.2", same_kernel) == Route::kLoopback);
    CHECK(route("10.0.0.7", "10.0.0.7", same_kernel) == Route::kLoopback);
    CHECK(route("::1", "::1", same_kernel) == Route::kLoopback);
    CHECK(route("::ffff:127.0.0.1", "::ffff:127.0.0.3", same_kernel) ==
          Route::kLoopback);
    CHECK(route("fd00::7", "fd00::7", same_kernel) == Route::kLoopback);
  }
  // Another address: behind a veth pair on this kernel, else elsewhere.
  CHECK(route("10.214.0.1", "10.214.0.2", true) == Route::kOtherNamespace);
  CHECK(route("10.214.0.1", "10.214.0.2", false) == Route::kNetwork);
  CHECK(route("fd00::1", "fd00::2", true) == Route::kOtherNamespace);
  CHECK(route("fd00::1", "fd00::2", false) == Route::kNetwork);
  CHECK(route("10.0.0.127", "10.0.0.1", true) == Route::kOtherNamespace);
  CHECK(route("fd00::7f00:1", "fd00::7f00:2", false) == Route::kNetwork);
  CHECK(route("10.0.0.1", "fd00::1", false) == Route::kNetwork);
  CHECK(route("::ffff:10.0.0.1", "::ffff:10.0.0.2", false) == Route::kNetwork);
}
