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

namespace comm::detail {

// Raises the soft RLIMIT_NOFILE to `wanted`, or to the hard limit where that
// is lower, and never lowers it. Returns the soft limit it leaves, which is
// UINT64_MAX where there is none. Thread-safe.
std::uint64_t raise_descriptor_limit(std::uint64_t wanted);

// Makes room for `more` descriptors beyond those open now, raising the soft
// limit as far as needed. Throws InvalidArgument where the hard limit leaves
// too few; its message starts with `who` and ends with `why_needed`, a
// phrase saying what they are for.
void reserve_descriptors(std::uint64_t more, const std::string& who,
                         const std::string& why_needed);

// For an errno from a call that makes a descriptor: where it is EMFILE or
// ENFILE, a parenthesis on the limits (starting with a space) to append to
// the message, else empty.
std::string descriptor_limit_hint(int error);

}  // namespace comm::detail
