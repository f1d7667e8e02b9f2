// The TCP backend's connections: three sockets to every other rank, set up
// through the group's Store.
//
// Channels keep traffic that progresses independently apart: collectives
// (whose messages follow the group's call order), point-to-point messages
// (matched by tag, in any order against collectives), and control (small
// whole messages, such as "my call failed because rank 3 died", that must
// reach a peer even while a large collective message to it is half sent).
//
// Set-up: each rank listens on an ephemeral port and publishes host:port in
// the store; rank r connects to every lower rank and accepts from every
// higher one. Each connection opens with a handshake (rank_handshake.h)
// carrying the group's job id (chosen by rank 0), the world size, the
// sender's rank and the channel, and, when the store has a token, a
// challenge-response with a key derived from it (Store::derive_key); a
// connection whose handshake does not fit (a stale job, a stranger, a wrong
// key) is closed and the rank keeps waiting for the right one.
//
// Ranks on this host (shm::LocalPeers) carry the collective and
// point-to-point channels over shared-memory rings instead, and are
// connected by the control channel only: a channel is either a socket or a
// ring (ring() says which), never both.
//
// Liveness during the set-up: every wait of it (for a peer's address, a
// connection to a peer, the peer's answer to it, the connections from
// higher ranks, the last barrier) is cut into slices, and between slices
// the rank looks for what dooms the set-up: a local peer that exited
// (shm::LocalPeers' "Liveness"), a peer whose connection hung up or that
// closed one before answering, a peer whose listener refuses connections
// for a second (rank 0 probes the highest rank's, to which no rank
// connects, until it has that rank's connections), and, once a second,
// another rank's failure posted in the last barrier (except while this
// rank waits at that barrier, which sees the outcome itself). A rank that fails
// posts its reason there (with a dead peer's number where a death caused the
// failure) before any of its sockets closes, and a rank looks there before it
// names a peer whose socket closed or whose process exited, so a peer that
// failed is reported with its reason, and only one that died is named as dead.
// So a rank of any host that dies once it has published its address is named by
// every other rank within seconds, not at the deadline. A stopped rank, or a
// host whose network drops the packets, is still waited for until the deadline,
// as is a rank that dies before it publishes its address.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "backends/shm/local_peers.h"
#include "backends/tcp/message_header.h"
#include "libcomm/detail/descriptors.h"
#include "libcomm/detail/socket.h"
#include "store/store.h"

namespace comm::tcp {

struct GroupIdentity;

enum class Channel : std::uint8_t {
  kCollective = 0,
  kPointToPoint = 1,
  kControl = 2
};
inline constexpr int kChannels = 3;

// Where a connection runs, which decides its send buffer (Mesh).
enum class Route : std::uint8_t {
  kLoopback,        // within one network namespace
  kOtherNamespace,  // between network namespaces of one kernel
  kNetwork,         // to another machine
};
// The route between the two ends of a connection, from their addresses and
// whether the peer runs on this kernel (shm::LocalPeers::same_kernel): a
// peer at a loopback address or at this end's own address is in this
// namespace; one at another address on this kernel is behind a veth pair
// or a bridge. (Two addresses of one namespace count as two namespaces:
// an approximation that costs only a smaller buffer.)
Route route_between(const sockaddr_storage& mine,
                    const sockaddr_storage& theirs, bool same_kernel);

class Mesh {
 public:
  // Connects to every other rank. Throws PeerError naming a peer that died
  // during the set-up, or carrying the reason another rank failed it;
  // InvalidArgument or SystemError for causes of this rank's own (its
  // listening address, its descriptors); TimeoutError naming the ranks
  // that did not connect within `timeout`.
  Mesh(Store& store, int rank, int size, std::chrono::milliseconds timeout);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The (non-blocking) socket to `peer` on `channel`; peer != rank(). Not
  // valid where the channel is a ring.
  detail::Socket& socket(int peer, Channel channel);
  // This rank's end of the ring that carries `channel` to `peer`
  // (`outgoing`) or from it, or null where the channel is a socket. The
  // control channel is always a socket.
  shm::Ring* ring(int peer, Channel channel, bool outgoing);
  // The shared-memory links (none to a rank of another host).
  shm::LocalPeers& local_peers() { return *local_; }
  // "rank 3 (127.0.0.1:41235)" for a rank this one connected to, "rank 5
  // (host 10.0.0.2)" for one that connected to this one, "rank 1 (pid 4242
  // on this host, over shared memory)" for a local one, for messages.
  const std::string& peer_name(int peer) const { return peer_names_[peer]; }

  // What this rank and `peer` owe each other in confirmations
  // (CollectiveStep::expect_confirmation and send_confirmation), kept from
  // call to call.
  struct Confirmations {
    // The calls whose confirmation `peer` still owes this rank on the
    // collective channel, oldest first. The channel's messages arrive in
    // order, so these are read before anything else `peer` sent
    // (Exchange::run).
    std::deque<CallInfo> unread;
    // The calls whose confirmation this rank owes `peer` and has not sent
    // yet, oldest first.
    std::deque<CallInfo> unsent;
    // How many calls after the oldest of them those are read at the latest
    // (window) and sent (batch). They depend on the channel to `peer` only,
    // so Exchange::confirmation_window works them out once and keeps them
    // here; 0 means not yet. Read them through Exchange::confirmation_window
    // and confirmation_batch only: a batch of 0 would send every call.
    std::uint64_t window_kept = 0;
    std::uint64_t batch_kept = 0;
  };
  Confirmations& confirmations(int peer) {
    return confirmations_[static_cast<std::size_t>(peer)];
  }

  // Reads from `peer`'s collective socket into `parts[0..count)` (at most
  // kMostReadParts), as readv would: the count of bytes read, 0 at the end
  // of the stream, -1 with errno set. Whatever else has arrived is taken
  // too, up to kReadAheadBytes, into a buffer of this peer's, from which
  // the next reads are served first without a system call. So a receiver
  // that finds several calls' small messages waiting (a root that runs
  // ahead, ranks that take turns on fewer CPUs) reads them all in one
  // call, as Open MPI's TCP transport does, where a read per message cost
  // a system call each. Every read of the collective socket goes through
  // here; only a step's receive reads it, one at a time per peer, in the
  // channel's order.
  ssize_t read_collective(int peer, const iovec* parts, int count);
  static constexpr int kMostReadParts = 4;
  static constexpr std::size_t kReadAheadBytes = 16 * 1024;

  // Waits until the bytes this rank sent `peers` on the collective channel
  // have all arrived (their sockets' send queues, unacknowledged bytes
  // included, are empty), or the connection was reset or closed, or until
  // `deadline`; returns false at the deadline. Rings need no wait: their bytes
  // stay readable after the writer closes. A socket closed with the peer's
  // bytes unread, or that the peer writes to after it was shut down, resets the
  // connection, and the reset discards what the send queue still holds (see
  // TcpBackend::shutdown).
  bool wait_until_delivered(std::span<const int> peers,
                            detail::Clock::time_point deadline);

  // Shuts every socket down (both directions) and closes every ring, so
  // that threads blocked on them wake up, without closing the descriptors
  // or unmapping the memory under them.
  void shutdown_all();

 private:
  // What the set-up's waits watch (throw_if_set_up_failed).
  struct SetUp;

  // Maps the local peers' rings, connects to every lower rank and accepts
  // every higher one, updating `claim` once it knows which are local.
  void connect_all(Store& store, const GroupIdentity& group, std::uint64_t job,
                   detail::Clock::time_point deadline,
                   detail::DescriptorClaim& claim, SetUp& set_up);
  void accept_from_higher_ranks(int listener, const GroupIdentity& group,
                                detail::Clock::time_point deadline,
                                SetUp& set_up);
  // Connects to `peer`'s listener at host:port, in slices, watching the
  // set-up between them; a refusal that lasts a second is a PeerError
  // naming the peer.
  detail::Socket connect_to_peer(int peer, const std::string& host,
                                 std::uint16_t port,
                                 detail::Clock::time_point deadline,
                                 SetUp& set_up);
  // Throws where the set-up cannot complete ("Liveness during the set-up"
  // above), saying that this rank was `doing` ("connecting to rank 3")
  // when it found out: a PeerError naming a local peer that exited or a
  // peer whose connection hung up, or the failure another rank posted in
  // the last barrier, which is looked at once a second, where a peer hung
  // up, and where `look_now`. Returns where nothing is wrong.
  void throw_if_set_up_failed(SetUp& set_up, const std::string& doing,
                              bool look_now = false);
  // Throws PeerGone naming a local peer whose process has exited, or, where
  // that peer (or another rank) posted a failure in the last barrier first,
  // that failure. Returns where no local peer has exited.
  void throw_if_local_peer_exited(SetUp& set_up, const std::string& doing);
  // Throws the failure posted in the last barrier, if one is: PeerError
  // naming a rank posted dead, or one saying that another rank failed, and
  // why. A store that does not answer is passed on where
  // `store_failure_is_news`, and taken for nothing posted otherwise.
  void throw_if_posted(SetUp& set_up, bool store_failure_is_news) const;
  // On rank 0, once a look: where the highest rank, on another host, has
  // published its address but not yet made all its connections to rank 0
  // (its listener is then open, if it lives), probes that listener, and
  // throws PeerGone naming that rank where it has refused for a second.
  // No other rank connects to the highest one, so without this its death
  // before its first connection would be waited for until the deadline.
  void throw_if_highest_rank_gone(SetUp& set_up, const std::string& doing);
  // The first peer one of whose sockets has hung up, or -1. One poll.
  int first_hung_up_peer() const;

  // Whether `channel` to `peer` is a socket.
  bool over_socket(int peer, int channel) const;

  int rank_;
  int size_;
  std::unique_ptr<shm::LocalPeers> local_;
  std::vector<std::array<detail::Socket, kChannels>> sockets_;
  std::vector<std::string> peer_names_;
  std::vector<Confirmations> confirmations_;
  // Bytes read from a peer's collective socket ahead of the receive they
  // belong to (read_collective): [begin, end) of `bytes`, allocated at
  // the first read from that peer.
  struct ReadAhead {
    std::unique_ptr<std::uint8_t[]> bytes;
    std::size_t begin = 0;
    std::size_t end = 0;
  };
  std::vector<ReadAhead> read_ahead_;
};

// The address this rank listens on: COMM_TCP_ADDR if set, 127.0.0.1 when
// MASTER_ADDR is unset or a loopback address, else the local address of the
// interface that routes to MASTER_ADDR.
std::string listen_address();

}  // namespace comm::tcp
