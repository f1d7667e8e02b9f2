// Sizing a memfd. ftruncate past the process's file-size limit
// (RLIMIT_FSIZE, `ulimit -f`) does not simply fail: the kernel sends
// SIGXFSZ, whose default action ends the process, leaving its peers with a
// rank that died in the middle of a set-up. A memfd sized here is held to
// that limit first, so that its caller gets an error it can report.
#pragma once

#include <cstddef>
#include <string>

namespace comm::detail {

// Sizes the memfd `fd` to `bytes`. Throws SystemError with EFBIG, naming the
// limit and how to raise it, where `bytes` passes the soft RLIMIT_FSIZE, and
// SystemError with ftruncate's errno where that fails; `what` begins each
// message.
void size_memfd(int fd, std::size_t bytes, const std::string& what);

}  // namespace comm::detail
