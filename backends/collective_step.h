// comm::CollectiveStep: one step of a collective algorithm, as a transport
// runs it: a set of sends, receives and relays to and from peers that
// progress together and run to completion.
//
// The algorithms (backends/tcp/algorithms.h) are written against this and
// CollectiveTransport only, so that every CPU transport can run them; the
// TCP backend's Exchange implements it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"

namespace comm {

class CollectiveStep {
 public:
  // One stretch of a message's payload in memory. A message may gather
  // several, in order. A received part is stored, or with `reduce` combined
  // into `data` (dtype elements, the receive's op): data op received, or
  // base op received where `base` is set, so that an out-of-place call
  // reads its input where it lies.
  struct Part {
    std::uint8_t* data = nullptr;
    std::size_t bytes = 0;
    bool reduce = false;
    const std::uint8_t* base = nullptr;
  };

  virtual ~CollectiveStep() = default;

  // A step holds at most one send and one receive per peer: the messages
  // between two ranks arrive in order.
  virtual void send(int peer, const void* data, std::size_t bytes) = 0;
  virtual void recv(int peer, void* data, std::size_t bytes) = 0;
  // The same for a message that says where a part lies in the sender's
  // memory (PeerMemory) instead of carrying the part. The message says
  // which kind it is, and a receive of the other kind fails with
  // MismatchError whatever the two lengths, so that ranks that disagree on
  // whether a part travels or is read never take an address for data or
  // data for an address.
  virtual void send_address(int peer, const void* data, std::size_t bytes) = 0;
  virtual void recv_address(int peer, void* data, std::size_t bytes) = 0;
  // Receives `bytes` and reduces them into `data` (dtype elements, op),
  // or into base op received with `base` (see Part).
  virtual void recv_reduce(int peer, void* data, std::size_t bytes, DType dtype,
                           ReduceOp op, const void* base = nullptr) = 0;
  // Receives one message whose payload fills `parts` in order, and returns
  // a handle for relay(). The step copies the list: it need not outlive the
  // call.
  virtual int recv_parts(int peer, std::span<const Part> parts, DType dtype,
                         ReduceOp op) = 0;
  // Sends one message gathered from `parts`, of which only the first
  // `ready` bytes can go at once: byte ready + x goes once the receive
  // `source` has stored or reduced its byte x. This is how a ring or a tree
  // forwards what it receives while the rest is still on its way; the
  // caller makes the parts past `ready` the memory that the receive fills.
  // With `ready` every byte of the parts and `source` -1 it is a plain
  // send of a message gathered from several parts. The step copies the
  // list, as recv_parts does.
  virtual void relay(int peer, std::span<const Part> parts, std::size_t ready,
                     int source) = 0;
  // A confirmation tells `peer` that this rank is in the same call, so
  // that a rank that only sends in a call (the root of a broadcast or
  // scatter, a child of a reduce or gather) finds out when the ranks it
  // sends to called something else (see broadcast.cpp). The step must
  // also receive from `peer`: the transport sends the confirmation once
  // that receive is complete, possibly several calls later and together
  // with others (the TCP backend's kConfirmationBatch). Unlike send(), it
  // succeeds when `peer` has left the group already: a peer that finished
  // this call and shut down needs it no more.
  virtual void send_confirmation(int peer) = 0;
  // Expects `peer`'s confirmation of this call without waiting for it: the
  // transport reads it before anything else `peer` sends this rank, and no
  // later than a window of calls on (the TCP backend's confirmation_window) or
  // when the group shuts down, so that a rank that only sends flows from
  // call to call as MPI's eager sends do. A confirmation that names another
  // call fails the collective that reads it with MismatchError (read as
  // the group shuts down, it is logged and reported to the peers instead).
  virtual void expect_confirmation(int peer) = 0;
  // Sends, before this step's transfers, every confirmation this rank owes
  // any peer, not only those owed to the peers this step sends to. A
  // transport reads a peer's confirmation before anything else that peer
  // sends, and the peer sends it before its own first step that sends to
  // this rank: where every rank runs steps of the same shape, that is the
  // step in which this rank receives from it. Where ranks may run steps of
  // different shapes in one call (an all_to_all with uneven splits, whose
  // ranks choose their algorithm by their own bytes), a peer may reach a
  // step that only receives from this rank while it still owes this rank
  // a confirmation; this rank, waiting for that confirmation, would never
  // send what the peer waits for. The first step of such a call calls
  // this; it costs a message to each peer owed something, and nothing
  // where nothing is owed.
  virtual void send_owed_confirmations() = 0;
  // Progresses every transfer until all are done; throws the call's error
  // (a comm::Error) when one fails.
  virtual void run() = 0;

 protected:
  CollectiveStep() = default;
  CollectiveStep(const CollectiveStep&) = default;
  CollectiveStep& operator=(const CollectiveStep&) = default;
};

}  // namespace comm
