// The one exception hierarchy of libcomm.
//
// Every failure inside the C++ API is thrown as a subclass of comm::Error, and
// each subclass maps to exactly one result code of the C API. Messages are
// written for the person who reads them: they say what was wrong and what to
// do, and errors whose cause lies in another process or in timing point at
// COMM_LOG_LEVEL, which makes the log show what led up to them.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include "libcomm/export.h"

namespace comm {

// The C API's view of an error; each Error subclass reports one of these.
enum class ErrorKind {
  kInvalidArgument,
  kTimeout,
  kPeer,
  kMismatch,
  kBackend,
  kSystem,
  kUnsupported,
};

class COMM_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
  ~Error() override;

  virtual ErrorKind kind() const noexcept = 0;
};

// The caller passed something that cannot work: a bad dtype for an op, a
// non-contiguous tensor, a malformed URL. Retrying will not help.
class COMM_API InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message);
  ErrorKind kind() const noexcept override;
};

// The call is well formed, but this build or this backend cannot do it: a
// backend or CUDA that was not built in, a reduction NCCL lacks. It is an
// InvalidArgument too, so code that catches those still catches it; the C
// API reports it as its own code.
class COMM_API UnsupportedError : public InvalidArgument {
 public:
  explicit UnsupportedError(const std::string& message);
  ErrorKind kind() const noexcept override;
};

// A blocking call did not finish within its timeout.
class COMM_API TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message);
  ErrorKind kind() const noexcept override;
};

// A peer rank died, closed its connection or broke the protocol. peer_rank()
// is that rank, or -1 when it is not known (a stray connection, say).
class COMM_API PeerError : public Error {
 public:
  PeerError(int peer_rank, const std::string& message);
  ErrorKind kind() const noexcept override;
  int peer_rank() const noexcept { return peer_rank_; }

 private:
  int peer_rank_;
};

// Ranks called different collectives, or the same one with different
// arguments (dtype, count, op, root).
class COMM_API MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& message);
  ErrorKind kind() const noexcept override;
};

// A backend library (NCCL, CUDA) or a backend's internal state failed.
class COMM_API BackendError : public Error {
 public:
  explicit BackendError(const std::string& message);
  ErrorKind kind() const noexcept override;
};

// A system call failed. error_code() is the errno it failed with.
class COMM_API SystemError : public Error {
 public:
  SystemError(int error_code, const std::string& what_failed);
  ErrorKind kind() const noexcept override;
  int error_code() const noexcept { return error_code_; }

 private:
  int error_code_;
};

// Appends the advice to raise COMM_LOG_LEVEL to `message`, unless the log
// already shows debug lines, so that errors caused by other processes or by
// timing tell the reader how to see what led up to them.
COMM_API std::string with_log_hint(std::string message);

// "3.2 s" or "150 ms", for messages.
COMM_API std::string format_duration(std::chrono::milliseconds duration);

}  // namespace comm
