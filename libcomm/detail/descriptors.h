// Open-file limits. A rank keeps a few descriptors for each peer (a socket
// per channel for a peer on another host; a control socket, a pidfd and two
// eventfds for one on its host), and a process hosting a TCPStore server one
// per client, so groups of some hundreds of ranks pass the soft limit of
// 1024 that most systems start processes with, while the hard limit is far
// higher. Running out half-way through a set-up would leave peers waiting on
// a rank that can no longer answer; these helpers make room first, or fail
// first and say what to change.
#pragma once

#include <cstdint>
#include <string>

#include "libcomm/export.h"

namespace comm::detail {

// Raises the soft RLIMIT_NOFILE to at least `needed`, where it is lower: to
// twice that, so that the program keeps room of its own, or to the hard
// limit where that is lower. Never lowers it. Returns the soft limit it
// leaves, UINT64_MAX where there is none. Thread-safe.
COMM_API std::uint64_t raise_descriptor_limit(std::uint64_t needed);

// A set-up's claim on descriptors it is about to open. While it lives, the
// descriptors it claims count as taken for every other claim of the
// process, so that groups set up at once by several threads make room for
// all of them together.
class DescriptorClaim {
 public:
  // Claims room for `count` descriptors beyond those open now and those
  // other claims hold, raising the soft limit as far as needed. Throws
  // InvalidArgument where the hard limit leaves too few; its message starts
  // with `who` and explains the count with `what_for` (a phrase: "3 for
  // each of its 39 peers").
  DescriptorClaim(std::uint64_t count, const std::string& who,
                  const std::string& what_for);
  ~DescriptorClaim();
  DescriptorClaim(const DescriptorClaim&) = delete;
  DescriptorClaim& operator=(const DescriptorClaim&) = delete;

  // Replaces the claim with one for `count` descriptors beyond those open
  // now (the set-up having opened some of the first), with the same checks.
  void update(std::uint64_t count, const std::string& what_for);

 private:
  std::string who_;
  std::uint64_t count_ = 0;
};

// For an errno from a call that makes a descriptor: where it is EMFILE or
// ENFILE, a parenthesis on the limits (starting with a space) to append to
// the message, else empty.
std::string descriptor_limit_hint(int error);

}  // namespace comm::detail
