#include "backends/tcp/mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <string_view>

#include "backends/tcp/rank_handshake.h"
#include "libcomm/detail/descriptors.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"
#include "libcomm/string_param.h"
#include "store/store_barrier.h"
#include "store/watched_wait.h"

namespace comm::tcp {
namespace {

const IntParam kLoopbackSendBufferBytes{
    "COMM_TCP_LOCAL_SNDBUF_BYTES", 256 << 10, 0, 1 << 30,
    "SO_SNDBUF of connections to ranks in this network namespace (over "
    "loopback); 0 keeps autotuning"};
const IntParam kNamespaceSendBufferBytes{
    "COMM_TCP_NETNS_SNDBUF_BYTES", 128 << 10, 0, 1 << 30,
    "SO_SNDBUF of connections to ranks of this kernel in another network "
    "namespace (a veth pair, a container bridge); 0 keeps autotuning"};
const StringParam kListenAddress{
    "COMM_TCP_ADDR",
    "127.0.0.1, or the local address that routes to a remote MASTER_ADDR",
    "the address the TCP backend listens on"};

// What is left of the time until `deadline`, in milliseconds, for poll:
// 0 once it has passed.
int remaining_ms(detail::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - detail::Clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

// The same as a timeout for the store, which takes at least a millisecond.
std::chrono::milliseconds left_until(detail::Clock::time_point deadline) {
  return std::chrono::milliseconds(std::max(1, remaining_ms(deadline)));
}

// Throws where a barrier of the set-up ended with another rank's failure.
// A set-up that failed on a peer's death posts that peer's number beside
// its reason in the last barrier, so that the others name it too: by the
// time they look, the reporting rank may have left as well.
constexpr std::string_view kDeathMark = "death of rank ";

// How often a set-up wait looks at the last barrier for another rank's
// failure, and how long each slice of a wait lasts on a rank with no local
// peer: each look and each slice of a store wait cost the store a request.
constexpr auto kLookAtBarrierEvery = std::chrono::seconds(1);
// How long a peer's listener must refuse connections before the peer is
// taken for gone. A rank listens from before it publishes its address
// until it has connected to every lower rank and every higher rank has
// connected to it, or until it exits, or fails and has posted why, so a
// refusal to a rank whose connection it has not made, or not taken, means
// one of those; the second is a margin for an address that reaches the
// peer only after a while.
constexpr auto kRefusedFor = std::chrono::seconds(1);

// Whether a peer's listener has refused every connection attempt for
// kRefusedFor: one answer of another kind (silence, or a connection)
// starts the count again.
class RefusalWatch {
 public:
  // Records an attempt begun at `start` that ended refused or not, and
  // says whether every attempt since kRefusedFor ago was refused.
  bool refused_long_enough(bool refused, detail::Clock::time_point start) {
    if (!refused) {
      since_ = detail::Clock::time_point::max();
      return false;
    }
    since_ = std::min(since_, start);
    return detail::Clock::now() - since_ >= kRefusedFor;
  }

 private:
  // When the current run of refusals began; max() outside one.
  detail::Clock::time_point since_ = detail::Clock::time_point::max();
};

// How long one probe of the highest rank's listener may take: a refusal
// comes back within a round trip, and a probe that hears nothing in this
// time is silence, which dooms nothing.
constexpr auto kProbeFor = std::chrono::milliseconds(100);

// Fails `barrier` with `death`, the dead rank's number beside its reason,
// and counts that rank out of it.
void report_death(const StoreBarrier& barrier, const shm::PeerGone& death) {
  fail_barrier(barrier,
               std::string(kDeathMark) + std::to_string(death.peer_rank()) +
                   ": " + death.what(),
               kLingerAfterFailure, death.peer_rank());
}

void expect_every_rank(const std::string& problem, const std::string& name,
                       int rank) {
  if (problem.empty()) return;
  if (problem.starts_with(kDeathMark)) {
    const std::size_t colon = problem.find(": ");
    const int dead = std::stoi(problem.substr(kDeathMark.size()));
    // Another rank took this one for dead (its connection to it broke): no
    // rank to name from here.
    if (dead != rank) throw PeerError(dead, problem.substr(colon + 2));
  }
  throw PeerError(
      -1, name + " cannot set it up, as another rank failed: " + problem);
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

std::string split_host(const std::string& address, std::uint16_t* port) {
  const auto colon = address.rfind(':');
  *port = static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)));
  std::string host = address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[')
    host = host.substr(1, host.size() - 2);
  return host;
}

// Whether `address` is a loopback one (127.0.0.0/8, ::1, or 127.0.0.0/8
// mapped into IPv6).
bool is_loopback_address(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    return (ntohl(v4.sin_addr.s_addr) >> 24) == 127;
  }
  if (address.ss_family == AF_INET6) {
    const in6_addr& v6 =
        reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) ||
           (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                       &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}

// Gives a connection on this machine a fixed send buffer. The kernel's
// autotuning grows it to megabytes (net.ipv4.tcp_wmem), so a sender runs
// far ahead of its receiver, and where both run on one kernel the queued
// data has left the cache by the time the receiver copies it out: there
// the copies are the whole cost. A fixed buffer keeps the queue in cache.
// Across network namespaces it is smaller
// (COMM_TCP_NETNS_SNDBUF_BYTES, 128 KiB, against
// COMM_TCP_LOCAL_SNDBUF_BYTES, 256 KiB, over loopback): with more queued
// than the congestion window lets out, the peer's acknowledgements send
// the rest from the softirq on the peer's CPU while this rank sends from
// its own, the veth pair delivers the two streams through two CPUs'
// queues, and the receiver sees them reordered, retransmits and shrinks
// the window, a state a connection then keeps (bench/README.md has the
// measurements). Connections that cross a network keep autotuning, which
// a long path needs to fill its bandwidth.
void fix_send_buffer(int fd, Route route) {
  std::int64_t bytes = 0;
  switch (route) {
    case Route::kLoopback: bytes = kLoopbackSendBufferBytes.get(); break;
    case Route::kOtherNamespace: bytes = kNamespaceSendBufferBytes.get(); break;
    case Route::kNetwork: return;
  }
  if (bytes > 0) {
    const int value = static_cast<int>(bytes);
    // Best effort: a refusal leaves autotuning on, which is only slower.
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof(value));
  }
}

// " (host 10.0.0.2)" for a connection accepted from 10.0.0.2, or "" when
// the address cannot be read; its port is not the peer's listening one.
std::string connected_host(int fd) {
  sockaddr_storage theirs{};
  socklen_t size = sizeof(theirs);
  char text[INET6_ADDRSTRLEN] = {};
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &size) != 0) {
    return "";
  }
  const void* address =
      theirs.ss_family == AF_INET
          ? static_cast<const void*>(
                &reinterpret_cast<const sockaddr_in&>(theirs).sin_addr)
          : static_cast<const void*>(
                &reinterpret_cast<const sockaddr_in6&>(theirs).sin6_addr);
  if (inet_ntop(theirs.ss_family, address, text, sizeof(text)) == nullptr) {
    return "";
  }
  return std::string(" (host ") + text + ")";
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

struct Mesh::SetUp {
  const StoreBarrier& connected;
  const std::string& name;  // "TCP backend: rank 2 of a group of 4"
  // How long each slice of a wait lasts: shorter where there are local
  // peers, whose deaths are seen without asking the store.
  Store::Duration slice = kLookAtBarrierEvery;
  // When the last barrier is next looked at for another rank's failure.
  detail::Clock::time_point next_look{};
  // Set while this rank waits at the last barrier, which sees its outcome
  // by itself.
  bool at_barrier = false;
  // This rank's listener and the connection it is opening, kept here so
  // that where the set-up fails they close only once the failure has been
  // posted: a peer that then finds them closed finds the reason too, and
  // does not take this rank for dead.
  detail::Socket listener;
  detail::Socket in_flight;
  // Rank 0's watch on the highest rank (throw_if_highest_rank_gone): its
  // published address, once read, and its listener's refusals.
  std::string highest_address;
  RefusalWatch highest_refusals;
};

std::string listen_address() {
  if (auto explicit_address = kListenAddress.get()) return *explicit_address;
  const char* master = std::getenv("MASTER_ADDR");
  if (master == nullptr || is_loopback_host(master)) return "127.0.0.1";
  // Ask the routing table which local address reaches the master: a UDP
  // socket's connect sends nothing.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master, "9", &hints, &found) != 0) return "127.0.0.1";
  std::string result = "127.0.0.1";
  const int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe >= 0 && connect(probe, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(probe, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      result = text;
    }
  }
  if (probe >= 0) close(probe);
  freeaddrinfo(found);
  return result;
}

Route route_between(const sockaddr_storage& mine,
                    const sockaddr_storage& theirs, bool same_kernel) {
  if (is_loopback_address(theirs) || same_address(mine, theirs)) {
    return Route::kLoopback;
  }
  return same_kernel ? Route::kOtherNamespace : Route::kNetwork;
}

Mesh::Mesh(Store& store, int rank, int size, std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      sockets_(size),
      peer_names_(size),
      confirmations_(size),
      read_ahead_(size) {
  const auto deadline = detail::deadline_after(timeout);
  // The job id tells this group's connections from any other's.
  std::uint64_t job = 0;
  if (rank == 0) {
    std::random_device entropy;
    job = (static_cast<std::uint64_t>(entropy()) << 32) | entropy();
    store.set_string("tcp/job", std::to_string(job));
  } else {
    job = std::stoull(store.get_string("tcp/job", timeout));
  }
  // Rank connections authenticate with a key derived from the store's token
  // (none without a token); see rank_handshake.h.
  GroupIdentity group;
  group.job = job;
  group.rank = rank;
  group.size = size;
  group.key = store.derive_key("tcp backend rank connections/job " +
                               std::to_string(job));
  // Two barriers through the store: one before any connection, so that a
  // rank whose descriptor limit cannot hold the group stops every rank at
  // once with its reason, and one after, so that every rank's control
  // thread starts with the others' and counts their silence from then
  // (among hundreds of ranks the lowest finish connecting seconds before
  // the others); a rank that fails to connect ends it for the others too.
  const std::string name = "TCP backend: rank " + std::to_string(rank) +
                           " of a group of " + std::to_string(size);
  const StoreBarrier started{store, "tcp/started/", rank, size,
                             "TCP backend set-up"};
  // The last barrier watches the local peers, where there are any, once
  // they are known (LocalPeers' "Liveness").
  StoreBarrier connected{store, "tcp/connected/", rank, size,
                         "TCP backend set-up"};
  // Three per peer at least (three sockets, or a socket, a pidfd and two
  // eventfds), and then exactly what is left once locality is known.
  const auto peers = static_cast<std::uint64_t>(size - 1);
  std::optional<detail::DescriptorClaim> claim;
  try {
    claim.emplace(3 * peers, name,
                  "its " + std::to_string(peers) + " peers, 3 each");
  } catch (const Error& e) {
    fail_barrier(started, e.what());
    throw;
  }
  expect_every_rank(arrive_and_wait(started, left_until(deadline)), name, rank);
  SetUp set_up{connected, name};
  // Where this rank posts a reason of its own, who it is.
  const std::string who = "rank " + std::to_string(rank) + ": ";
  try {
    connect_all(store, group, job, deadline, *claim, set_up);
  } catch (const Error& e) {
    // A failure that a local peer's death caused (its listener closed, a
    // connection to it reset, the store it hosted gone) is reported as
    // that death, unless it blames that peer already.
    const std::exception_ptr failure = std::current_exception();
    const auto* blamed = dynamic_cast<const PeerError*>(&e);
    // Where another rank posted first, its reason stands.
    bool posted = false;
    try {
      posted = completed_outcome(connected).has_value();
    } catch (const Error&) {
      // The store went, perhaps with a local peer that died.
    }
    if (!posted && local_ != nullptr) {
      try {
        local_->throw_if_exited(local_->local_ranks(), "setting up the group");
      } catch (const shm::PeerGone& dead) {
        report_death(connected, dead);
        if (blamed == nullptr || blamed->peer_rank() != dead.peer_rank()) {
          throw;
        }
        std::rethrow_exception(failure);
      }
    }
    // A peer found gone (a local one whose set-up of shared memory saw it
    // exit, one of another host that hung up or stopped listening) is
    // named to the others as dead.
    if (const auto* gone = dynamic_cast<const shm::PeerGone*>(&e)) {
      report_death(connected, *gone);
    } else {
      fail_barrier(connected, who + e.what());
    }
    throw;
  } catch (const std::exception& e) {
    fail_barrier(connected, who + e.what());
    throw;
  }
  claim.reset();
  set_up.listener.close();  // every peer has connected
  set_up.at_barrier = true;
  connected.watch = [&] {
    throw_if_set_up_failed(set_up, "waiting for every rank to connect");
  };
  connected.watch_every = set_up.slice;
  std::string outcome;
  try {
    outcome = arrive_and_wait(connected, left_until(deadline));
  } catch (const shm::PeerGone& e) {
    // Ended for the others too, and this rank lingers a moment, so that
    // the store it may host outlives their look at the dead rank.
    report_death(connected, e);
    throw;
  } catch (const std::exception& e) {
    // A timeout, say: posted before this rank's sockets close, so that no
    // peer takes it for dead.
    fail_barrier(connected, who + e.what());
    throw;
  }
  expect_every_rank(outcome, name, rank);
  COMM_LOG_DEBUG("TCP backend: rank {} connected to {} peers", rank, size - 1);
}

void Mesh::connect_all(Store& store, const GroupIdentity& group,
                       std::uint64_t job, detail::Clock::time_point deadline,
                       detail::DescriptorClaim& claim, SetUp& set_up) {
  const int rank = rank_;
  const int size = size_;
  const auto peers = static_cast<std::uint64_t>(size - 1);
  try {
    local_ =
        std::make_unique<shm::LocalPeers>(store, rank, size, job, deadline);
  } catch (const Error& e) {
    shm::LocalPeers::publish_failure(store, rank, e.what());
    throw;
  }
  const auto on_host = static_cast<std::uint64_t>(local_->local_count() - 1);
  claim.update(1 + on_host + 3 * (peers - on_host),
               "a listening socket and the sockets to its " +
                   std::to_string(peers) + " peers (" +
                   std::to_string(on_host) +
                   " on this host, 1 each, and 3 for each other one)");
  for (int peer = 0; peer < size; ++peer) {
    if (local_->is_local(peer)) {
      peer_names_[peer] = "rank " + std::to_string(peer) + " (pid " +
                          std::to_string(local_->pid(peer)) +
                          " on this host, over shared memory)";
    }
  }

  const std::string host = listen_address();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (const int status = getaddrinfo(host.c_str(), "0", &hints, &found);
      status != 0) {
    throw InvalidArgument("TCP backend: cannot listen on '" + host +
                          "' (COMM_TCP_ADDR): " + gai_strerror(status));
  }
  set_up.listener =
      detail::Socket(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const detail::Socket& listener = set_up.listener;
  const int one = 1;
  setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound =
      bind(listener.fd(), found->ai_addr, found->ai_addrlen) == 0 &&
      listen(listener.fd(), 1024) == 0;
  freeaddrinfo(found);
  if (!bound) throw SystemError(errno, "TCP backend: listen on " + host);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&local), &length);
  const std::uint16_t port =
      ntohs(local.ss_family == AF_INET
                ? reinterpret_cast<sockaddr_in*>(&local)->sin_port
                : reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  store.set_string("tcp/addr/" + std::to_string(rank),
                   detail::host_port(host, port));

  // The set-up's waits end early where it cannot complete ("Liveness
  // during the set-up", mesh.h); local peers' deaths are seen without the
  // store, so a rank with some watches more often.
  if (local_->local_count() > 1) set_up.slice = kWatchEvery;
  for (int peer = 0; peer < rank; ++peer) {
    const auto watch = [&] {
      throw_if_set_up_failed(
          set_up, "waiting for the address of rank " + std::to_string(peer));
    };
    const std::string address =
        to_string(multi_get_watched(store, {"tcp/addr/" + std::to_string(peer)},
                                    deadline, watch, set_up.slice)[0]);
    std::uint16_t peer_port = 0;
    const std::string peer_host = split_host(address, &peer_port);
    // The peer answers once it reaches its accept loop; one that closes
    // the connection first, with no reason posted, is gone.
    const auto handshake_watch = [&](bool closed) {
      const std::string doing =
          "waiting for rank " + std::to_string(peer) + " to answer";
      throw_if_set_up_failed(set_up, doing, /*look_now=*/closed);
      if (!closed) return;
      throw shm::PeerGone(peer, "TCP backend: " + peer_names_[peer] +
                                    " closed the connection while rank " +
                                    std::to_string(rank_) + " was " + doing +
                                    ": it exited or failed its set-up");
    };
    if (!local_->is_local(peer)) {
      peer_names_[peer] = "rank " + std::to_string(peer) + " (" + address + ")";
    }
    for (int channel = 0; channel < kChannels; ++channel) {
      if (!over_socket(peer, channel)) continue;
      set_up.in_flight =
          connect_to_peer(peer, peer_host, peer_port, deadline, set_up);
      connect_handshake(set_up.in_flight, group, channel, peer,
                        peer_names_[peer], deadline, handshake_watch,
                        set_up.slice);
      sockets_[peer][channel] = std::move(set_up.in_flight);
    }
  }
  accept_from_higher_ranks(listener.fd(), group, deadline, set_up);
  local_->read_hosts(store, deadline);
  for (int peer = 0; peer < size; ++peer) {
    for (detail::Socket& connection : sockets_[peer]) {
      if (!connection.valid()) continue;
      sockaddr_storage mine{}, theirs{};
      socklen_t mine_size = sizeof(mine), theirs_size = sizeof(theirs);
      if (getsockname(connection.fd(), reinterpret_cast<sockaddr*>(&mine),
                      &mine_size) != 0 ||
          getpeername(connection.fd(), reinterpret_cast<sockaddr*>(&theirs),
                      &theirs_size) != 0) {
        continue;  // a connection already reset fails at its first use
      }
      const Route route =
          route_between(mine, theirs, local_->same_kernel(peer));
      fix_send_buffer(connection.fd(), route);
    }
  }
}

detail::Socket Mesh::connect_to_peer(int peer, const std::string& host,
                                     std::uint16_t port,
                                     detail::Clock::time_point deadline,
                                     SetUp& set_up) {
  const std::string doing = "connecting to rank " + std::to_string(peer);
  RefusalWatch refusals;
  // Bounded by the deadline: each round connects for a slice at most.
  for (;;) {
    const auto slice_start = detail::Clock::now();
    const auto slice_end = std::min(deadline, slice_start + set_up.slice);
    int last_error = 0;
    try {
      return detail::Socket::connect(host, port, slice_end, "TCP backend",
                                     &last_error);
    } catch (const TimeoutError&) {
      if (slice_end == deadline) throw;
    }
    throw_if_set_up_failed(set_up, doing);
    // Silence (a slow network, or a stopped host) is waited for.
    if (!refusals.refused_long_enough(last_error == ECONNREFUSED,
                                      slice_start)) {
      continue;
    }
    throw_if_set_up_failed(set_up, doing, /*look_now=*/true);
    throw shm::PeerGone(peer, "TCP backend: nothing accepted rank " +
                                  std::to_string(rank_) + "'s connections to " +
                                  peer_names_[peer] + " for " +
                                  format_duration(kRefusedFor) +
                                  ": it exited or failed its set-up, or the "
                                  "address it published (COMM_TCP_ADDR) does "
                                  "not reach it from here");
  }
}

int Mesh::first_hung_up_peer() const {
  std::vector<pollfd> entries;
  std::vector<int> owners;
  for (int peer = 0; peer < size_; ++peer) {
    for (const detail::Socket& connection : sockets_[peer]) {
      if (!connection.valid()) continue;
      entries.push_back({connection.fd(), POLLRDHUP, 0});
      owners.push_back(peer);
    }
  }
  if (entries.empty() || poll(entries.data(), entries.size(), 0) <= 0) {
    return -1;
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if ((entries[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      return owners[i];
    }
  }
  return -1;
}

void Mesh::throw_if_local_peer_exited(SetUp& set_up, const std::string& doing) {
  if (local_->local_count() < 2) return;
  try {
    local_->throw_if_exited(local_->local_ranks(), doing);
  } catch (const shm::PeerGone&) {
    // A peer that failed posted why before it exited. A store that went
    // with it leaves the death as the news.
    throw_if_posted(set_up, /*store_failure_is_news=*/false);
    throw;
  }
}

void Mesh::throw_if_posted(SetUp& set_up, bool store_failure_is_news) const {
  std::optional<std::string> outcome;
  try {
    outcome = completed_outcome(set_up.connected);
  } catch (const Error&) {
    if (store_failure_is_news) throw;
  }
  if (outcome) expect_every_rank(*outcome, set_up.name, rank_);
}

void Mesh::throw_if_set_up_failed(SetUp& set_up, const std::string& doing,
                                  bool look_now) {
  throw_if_local_peer_exited(set_up, doing);
  const int hung_up = first_hung_up_peer();
  const auto now = detail::Clock::now();
  const bool time_to_look = !set_up.at_barrier && now >= set_up.next_look;
  if (hung_up >= 0 || look_now || time_to_look) {
    set_up.next_look = now + kLookAtBarrierEvery;
    // A rank that fails posts its reason before it closes its sockets, so
    // a peer that hung up with a reason is reported with that reason. The
    // store's own failure is passed on, as without the watch, unless a
    // peer is known gone (hung up here, or at the caller where it looks
    // now).
    throw_if_posted(set_up, /*store_failure_is_news=*/hung_up < 0 && !look_now);
  }
  if (hung_up >= 0) {
    throw shm::PeerGone(hung_up, "TCP backend: " + peer_names_[hung_up] +
                                     " closed its connection while rank " +
                                     std::to_string(rank_) + " was " + doing +
                                     ": it exited or failed its set-up");
  }
  if (time_to_look) throw_if_highest_rank_gone(set_up, doing);
}

void Mesh::throw_if_highest_rank_gone(SetUp& set_up, const std::string& doing) {
  const int highest = size_ - 1;
  if (rank_ != 0 || highest == 0 || local_->is_local(highest)) return;
  bool connected = true;
  for (int channel = 0; channel < kChannels; ++channel) {
    if (over_socket(highest, channel) && !sockets_[highest][channel].valid()) {
      connected = false;
    }
  }
  // Once all its connections are in, their hang-ups are watched instead,
  // and its listener may close.
  if (connected) return;
  if (set_up.highest_address.empty()) {
    Store& store = set_up.connected.store;
    const std::string key = "tcp/addr/" + std::to_string(highest);
    // Not published yet: waited for, as a slow rank would be.
    if (!store.check({key})) return;
    set_up.highest_address = to_string(store.get(key));
    peer_names_[highest] =
        "rank " + std::to_string(highest) + " (" + set_up.highest_address + ")";
  }
  std::uint16_t port = 0;
  const std::string host = split_host(set_up.highest_address, &port);
  int last_error = 0;
  const auto probe_start = detail::Clock::now();
  try {
    // A probe that connects lands in the listener's backlog, which the
    // highest rank, having no higher ranks, never accepts from; it closes
    // with the listener.
    detail::Socket::connect(host, port, detail::deadline_after(kProbeFor),
                            "TCP backend", &last_error);
    last_error = 0;
  } catch (const TimeoutError&) {
    // Refused or unanswered: last_error says which.
  } catch (const Error&) {
    // An address this rank cannot reach (a route, say) says nothing of the
    // highest rank, which connects to this one and not the other way.
    last_error = 0;
  }
  if (!set_up.highest_refusals.refused_long_enough(last_error == ECONNREFUSED,
                                                   probe_start)) {
    return;
  }
  throw_if_posted(set_up, /*store_failure_is_news=*/false);
  throw shm::PeerGone(
      highest,
      "TCP backend: " + peer_names_[highest] + " refused rank 0's probes for " +
          format_duration(kRefusedFor) + " while rank 0 was " + doing +
          ", before it had connected: it exited or failed its set-up, or the "
          "address it published (COMM_TCP_ADDR) does not reach it from here");
}

void Mesh::accept_from_higher_ranks(int listener, const GroupIdentity& group,
                                    detail::Clock::time_point deadline,
                                    SetUp& set_up) {
  int expected = 0;
  for (int peer = rank_ + 1; peer < size_; ++peer) {
    for (int channel = 0; channel < kChannels; ++channel) {
      expected += over_socket(peer, channel) ? 1 : 0;
    }
  }
  // Bounded by the deadline: each round waits in poll for a connection,
  // for any local peer to end (LocalPeers' pidfds: one that has connected
  // already, or that never will, dooms the set-up as surely), or for the
  // slice to pass, after which it watches the set-up.
  const std::string doing = "waiting for connections from higher ranks";
  const int slice_ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(set_up.slice)
          .count());
  auto next_watch = detail::Clock::now() + set_up.slice;
  std::vector<pollfd> entries;
  while (expected > 0) {
    entries.assign(1, {listener, POLLIN, 0});
    for (int peer : local_->local_ranks()) {
      if (peer != rank_) entries.push_back({local_->pidfd(peer), POLLIN, 0});
    }
    const int ready = poll(entries.data(), entries.size(),
                           std::min(slice_ms, remaining_ms(deadline)));
    if (ready < 0 && errno == EINTR) continue;
    throw_if_local_peer_exited(set_up, doing);
    if (detail::Clock::now() >= next_watch) {
      throw_if_set_up_failed(set_up, doing);
      next_watch = detail::Clock::now() + set_up.slice;
    }
    if (ready == 0 && detail::Clock::now() < deadline) continue;
    if (ready > 0 && entries[0].revents == 0) continue;
    if (ready <= 0) {
      std::string missing;
      for (int peer = rank_ + 1; peer < size_; ++peer) {
        if (!sockets_[peer][kChannels - 1].valid()) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
        }
      }
      throw TimeoutError("TCP backend: rank " + std::to_string(rank_) +
                         " timed out waiting for connections from rank(s) " +
                         missing);
    }
    detail::Socket connection(
        accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) {
      // Out of descriptors or memory the connection stays in the backlog
      // and the listener stays readable: waiting would spin to the deadline.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        throw SystemError(errno, "TCP backend: rank " + std::to_string(rank_) +
                                     " accepting a connection from a peer");
      }
      continue;  // the client gave up first, or a signal came
    }
    // A stranger that connects and says nothing must not stall the set-up
    // for long.
    const auto accepted = accept_handshake(
        connection, group, kChannels,
        [this](int peer, int channel) {
          return over_socket(peer, channel) && !sockets_[peer][channel].valid();
        },
        std::min(deadline, detail::deadline_after(std::chrono::seconds(5))));
    if (!accepted) continue;
    set_nonblocking(connection.fd());
    connection.set_no_delay();
    if (!local_->is_local(accepted->rank)) {
      peer_names_[accepted->rank] = "rank " + std::to_string(accepted->rank) +
                                    connected_host(connection.fd());
    }
    sockets_[accepted->rank][accepted->channel] = std::move(connection);
    --expected;
  }
}

Mesh::~Mesh() = default;

detail::Socket& Mesh::socket(int peer, Channel channel) {
  return sockets_[peer][static_cast<int>(channel)];
}

bool Mesh::over_socket(int peer, int channel) const {
  return channel == static_cast<int>(Channel::kControl) ||
         !local_->is_local(peer);
}

shm::Ring* Mesh::ring(int peer, Channel channel, bool outgoing) {
  if (over_socket(peer, static_cast<int>(channel))) return nullptr;
  const int lane = channel == Channel::kCollective ? 0 : 1;
  return outgoing ? &local_->outgoing(peer, lane)
                  : &local_->incoming(peer, lane);
}

ssize_t Mesh::read_collective(int peer, const iovec* parts, int count) {
  ReadAhead& ahead = read_ahead_[static_cast<std::size_t>(peer)];
  if (ahead.begin < ahead.end) {
    std::size_t moved = 0;
    for (int i = 0; i < count && ahead.begin < ahead.end; ++i) {
      const std::size_t n = std::min(parts[i].iov_len, ahead.end - ahead.begin);
      std::memcpy(parts[i].iov_base, ahead.bytes.get() + ahead.begin, n);
      ahead.begin += n;
      moved += n;
    }
    if (ahead.begin == ahead.end) ahead.begin = ahead.end = 0;
    return static_cast<ssize_t>(moved);
  }
  if (count > kMostReadParts) {
    throw BackendError("Mesh::read_collective: " + std::to_string(count) +
                       " parts, more than " + std::to_string(kMostReadParts));
  }
  if (!ahead.bytes) {
    ahead.bytes =
        std::make_unique_for_overwrite<std::uint8_t[]>(kReadAheadBytes);
  }
  iovec all[kMostReadParts + 1];
  std::size_t wanted = 0;
  for (int i = 0; i < count; ++i) {
    all[i] = parts[i];
    wanted += parts[i].iov_len;
  }
  all[count] = {ahead.bytes.get(), kReadAheadBytes};
  const ssize_t n =
      ::readv(socket(peer, Channel::kCollective).fd(), all, count + 1);
  if (n <= 0) return n;
  const auto got = static_cast<std::size_t>(n);
  if (got <= wanted) return n;
  ahead.end = got - wanted;
  return static_cast<ssize_t>(wanted);
}

bool Mesh::wait_until_delivered(std::span<const int> peers,
                                detail::Clock::time_point deadline) {
  for (int peer : peers) {
    if (!over_socket(peer, static_cast<int>(Channel::kCollective))) continue;
    const int fd = sockets_[peer][static_cast<int>(Channel::kCollective)].fd();
    // Bounded by `deadline`: each round sleeps a millisecond on the
    // socket. The kernel tells no one when a send queue empties, and this
    // runs once, as the group shuts down. A connection that was reset or
    // closed (the peer died or left) keeps counting what was in flight as
    // queued, but polls as failed or hung up: nothing will arrive there.
    while (true) {
      int queued = 0;
      if (::ioctl(fd, SIOCOUTQ, &queued) != 0 || queued == 0) break;
      if (detail::Clock::now() >= deadline) return false;
      pollfd watch{fd, 0, 0};
      if (::poll(&watch, 1, 1) > 0 &&
          (watch.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
        break;
      }
    }
  }
  return true;
}

void Mesh::shutdown_all() {
  for (auto& channels : sockets_) {
    for (auto& s : channels) {
      if (s.valid()) ::shutdown(s.fd(), SHUT_RDWR);
    }
  }
  local_->close_all();
}

}  // namespace comm::tcp
