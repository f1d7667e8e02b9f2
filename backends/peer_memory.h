// comm::PeerMemory: reading another rank's memory directly, which a
// transport between ranks of one host may offer (CollectiveTransport::
// peer_memory()), so that an algorithm copies each byte once, from where a
// peer holds it to where this rank wants it, instead of through a channel
// that the writer copies into and the reader copies out of.
//
// An address means something only to the rank that owns it. Algorithms
// offer their buffers, trade addresses and sizes in ordinary steps (whose
// headers keep the mismatch checks working), read, and end with a step
// that tells each rank that its buffers are no longer read, so that no
// rank returns, and lets its caller reuse a buffer, while a peer may still
// read it (backends/tcp/single_copy.h). A rank that fails leaves without
// that step; it withdraws its offer first, and a reader confirms each
// peer's offer after reading and before it tells anyone that it is done,
// so that what a rank's caller may write into a buffer after the rank
// left is never taken for its data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "libcomm/shared_host_memory.h"

namespace comm {

// Where a buffer lies in the rank that owns it, as algorithms trade it:
// its address and size, and, where it lies in shared host memory
// (libcomm/shared_host_memory.h), the block that holds it (serial 0
// otherwise) and how many blocks its owner had freed, by which a reader
// that maps the owner's blocks knows when to drop its mappings.
struct PeerRegion {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  SharedHostBlock block;
  std::uint64_t blocks_freed = 0;
};

class PeerMemory {
 public:
  virtual ~PeerMemory() = default;

  // This rank's buffers may be read in this call from now on, until
  // withdraw(). Offer before sending an address; withdraw before leaving
  // the call, on every way out (single_copy.h's Offer does both).
  virtual void offer() = 0;
  virtual void withdraw() = 0;

  // Copies `bytes` at `offset` in `region` of rank `peer` (not this rank)
  // into `into`: from this process's mapping of the region's block where
  // the region lies in shared host memory, through the kernel otherwise.
  // What it copied is the peer's data only once a confirm() naming the peer
  // has returned. Throws PeerError naming the peer when its process has
  // ended, the peer's failure report when the read fails because the peer
  // left the call (it failed), and BackendError when the kernel refuses the
  // read.
  virtual void read(int peer, const PeerRegion& region, std::uint64_t offset,
                    void* into, std::size_t bytes) = 0;
  // Where `region` of rank `peer` (not this rank) lies in this process:
  // its bytes, readable in place until the call ends, where the region
  // lies in shared host memory; null where it does not, or where the block
  // cannot be mapped here (the peer's memory is then read()). Read in
  // place, the bytes are the peer's data only once a confirm() naming the
  // peer has returned. Throws as read() does.
  virtual const std::uint8_t* mapped(int peer, const PeerRegion& region) = 0;
  // Returns when every rank in `peers` still offers its buffers and its
  // process lives, so that every read of them made before copied their
  // data: call it after the reads and before telling anyone they are done.
  // One call for all the peers read, since it may cost a system call
  // whatever their number. Throws, for the first peer in `peers` that
  // fails: PeerError naming it when its process has ended (its id may have
  // gone to another process), and its failure report when it withdrew its
  // offer (it failed and left the call), or PeerError naming it when none
  // comes.
  virtual void confirm(std::span<const int> peers) = 0;

  // Whether read() copies at a good share of memcpy's speed here (see
  // backends/shm/kernel_copy.h): where it does, two ranks read each
  // other's buffers in the collectives that gain from it at two ranks
  // only then, and larger groups from smaller sizes
  // (backends/tcp/single_copy.h). The same answer on every rank of the
  // group.
  virtual bool kernel_copy_keeps_up() const = 0;

  // At least `bytes` of scratch memory for reading into, kept by the
  // transport from one call to the next, so that a call does not pay for
  // fresh pages; valid until the next scratch() call.
  virtual std::uint8_t* scratch(std::size_t bytes) = 0;

 protected:
  PeerMemory() = default;
  PeerMemory(const PeerMemory&) = default;
  PeerMemory& operator=(const PeerMemory&) = default;
};

}  // namespace comm
