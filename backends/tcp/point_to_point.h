// Point-to-point messages of the TCP backend: send and recv by tag, and
// recv from any source, on a channel of their own so that they progress
// independently of collectives (and of each other: a posted receive never
// waits behind an unrelated send).
//
// One thread moves all point-to-point traffic with poll(); a peer on this
// host is reached through shared-memory rings instead of a socket, with
// the same bytes. Sends to a peer
// go out in the order they were posted. A peer's incoming messages are read
// only while some posted receive could take them; a message whose tag no
// posted receive wants is kept until one does, so tags may be received in
// any order. A receive matches the earliest kept or arriving message from
// its source (any source: from whichever peer) with its tag.
//
// A peer lost while an operation names it (its connection closed or reset,
// its process ended) is news for the whole group, as a collective's
// failure is: before any operation fails on it, the rank tells every rank
// through the control channel, itself included, so that their collectives,
// which that peer will never join, fail naming it (control_channel.h). A
// peer that leaves after it reported another rank lost is taken to have
// left because of that loss, and that rank is named. A peer that leaves
// while only receives from any rank could take its messages is not news:
// it may have ended as its program meant it to. An operation whose peer
// lives waits for it, up to the operation's timeout, whatever befell
// other ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/tcp/control_channel.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/message_header.h"
#include "libcomm/work.h"

namespace comm::tcp {

class PointToPoint {
 public:
  // `control` carries the news of a lost peer to the others (above).
  PointToPoint(Mesh& mesh, ControlChannel& control);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // `keep_alive` holds whatever must outlive the transfer (the tensor).
  void post_send(std::shared_ptr<Work> work, std::shared_ptr<void> keep_alive,
                 int peer, int tag, DType dtype, const void* data,
                 std::size_t bytes, detail::Clock::time_point deadline);
  // peer may be kAnySource (-1). `on_success` runs on the progress thread
  // once the data is in place, before the Work completes (to copy a staged
  // receive to its CUDA tensor); an exception from it fails the Work.
  void post_recv(std::shared_ptr<Work> work, std::shared_ptr<void> keep_alive,
                 int peer, int tag, DType dtype, void* data, std::size_t bytes,
                 detail::Clock::time_point deadline,
                 std::function<void()> on_success = {});

  // Fails every pending operation with `error` and stops the thread.
  void stop(std::exception_ptr error);

 private:
  struct Operation {
    std::shared_ptr<Work> work;
    std::shared_ptr<void> keep_alive;
    int peer;
    int tag;
    DType dtype;
    std::uint8_t* data;
    std::size_t bytes;
    detail::Clock::time_point deadline;
    std::function<void()> on_success;
    std::uint8_t header[MessageHeader::kWireSize];
    std::size_t header_done = 0;
    std::size_t payload_done = 0;
  };
  // A message that arrived before any receive wanted it.
  struct Kept {
    int peer;
    MessageHeader header;
    std::vector<std::uint8_t> payload;
  };
  // What is being read from one peer right now.
  struct Incoming {
    std::uint8_t header_bytes[MessageHeader::kWireSize];
    std::size_t header_done = 0;
    MessageHeader header;
    std::shared_ptr<Operation> receiver;  // null while keeping the message
    bool discard = false;                 // its receiver was failed as a misfit
    std::vector<std::uint8_t> kept;
    std::size_t payload_done = 0;
  };

  void loop();
  void wake();
  // All need mutex_.
  bool try_match_kept(const std::shared_ptr<Operation>& receive);
  std::shared_ptr<Operation> take_receiver(int peer,
                                           const MessageHeader& header);
  bool wants_input(int peer) const;
  void progress_send(int peer);
  void progress_recv(int peer);
  // A peer over shared-memory rings: progresses it when its rings can
  // move, and returns whether they could.
  bool progress_ring(int peer);
  // A peer over rings whose process ended: fails its operations once its
  // rings hold nothing more for them.
  void ring_peer_exited(int peer);
  void fail_peer(int peer, const std::exception_ptr& error);
  // fail_peer for `error`, which the peer's channel raised, except where
  // it says that the peer is gone (shm::PeerGone naming it: its connection
  // closed or reset, its process ended) and an operation names that peer:
  // then the peer stops being polled and waits in lost_ for settle_lost(),
  // and operations posted to it meanwhile wait with the others.
  void lose_peer(int peer, std::exception_ptr error);
  // A peer lost, with the error its operations fail with.
  struct Lost {
    int peer;
    std::exception_ptr error;
  };
  // For each lost peer: waits until its control connection has been read
  // to its end (ControlChannel::kLastWordsWait at most, less on stop()),
  // tells every rank, this one included (ControlChannel::record_own_report),
  // what explain_loss() returns, and fails the peer's operations. Call
  // without mutex_.
  void settle_lost();
  // Says why `lost` went. Returns the report that tells the others of it:
  // naming the rank that the peer (or, failing that, any rank) reported
  // lost where one was, with `lost.error` rewritten to name that rank
  // too, and naming the peer otherwise. Returns nothing for a peer that
  // said it shut its group down (ControlChannel::departure) where no rank
  // was reported lost, as its leaving is no death; `lost.error` then says
  // so. Call without mutex_.
  std::optional<ControlMessage> explain_loss(Lost& lost);
  void expire(detail::Clock::time_point now);
  void complete(const std::shared_ptr<Operation>& op, std::exception_ptr error,
                int source);

  Mesh& mesh_;
  ControlChannel& control_;
  int wake_fd_ = -1;
  std::mutex mutex_;
  bool stopping_ = false;
  std::vector<std::deque<std::shared_ptr<Operation>>> sends_;  // per peer
  std::list<std::shared_ptr<Operation>> receives_;             // posted order
  std::list<Kept> kept_;
  std::vector<Incoming> incoming_;          // per peer
  std::vector<std::exception_ptr> broken_;  // per peer
  std::vector<Lost> lost_;  // the progress thread's alone: no lock
  // Per peer: lost, waiting in lost_ (not polled; posts to it queue).
  std::vector<char> settling_;
  std::uint64_t sent_ = 0;
  std::thread thread_;
};

}  // namespace comm::tcp
