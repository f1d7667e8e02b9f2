// comm::tcp::ReportedFailure: thrown out of a collective step for a failure
// that the other ranks already know of, so that nobody reports it again.
//
// Exchange::run() throws it for a failure a peer reported on the control
// channel, and for a timeout it has itself told the others about. The
// backend catches it in one place (TcpBackend::execute), completes the call
// with error(), and broadcasts nothing; any other exception out of a
// collective is a failure of this rank, which the backend reports. It is
// not a comm::Error, so that no handler of comm errors takes it by mistake.
#pragma once

#include <exception>
#include <utility>

namespace comm::tcp {

class ReportedFailure {
 public:
  // `error`: the call's failure as its caller sees it (a PeerError,
  // MismatchError, TimeoutError or BackendError naming the first cause).
  explicit ReportedFailure(std::exception_ptr error)
      : error_(std::move(error)) {}

  const std::exception_ptr& error() const { return error_; }

 private:
  std::exception_ptr error_;
};

}  // namespace comm::tcp
