// comm::tcp::ReportedFailure: marks a collective's error that the other
// ranks already know of, so that nobody reports it again.
//
// Exchange::run() throws Reported<E> (an E, such as a PeerError, and a
// ReportedFailure) for a failure a peer reported on the control channel,
// and for a timeout it has itself told the others about. The backend
// catches ReportedFailure in one place (TcpBackend::execute) and broadcasts
// nothing for it; any other exception out of a collective is a failure of
// this rank, which the backend reports. To everyone else the error is just
// an E: callers catch it, and read its kind and message, as any other.
#pragma once

#include <utility>

namespace comm::tcp {

class ReportedFailure {
 protected:
  ReportedFailure() = default;
  ReportedFailure(const ReportedFailure&) = default;
  ReportedFailure& operator=(const ReportedFailure&) = default;
  ~ReportedFailure() = default;
};

// `E` is a comm::Error; Reported<E> takes E's constructor arguments.
template <typename E>
class Reported final : public E, public ReportedFailure {
 public:
  template <typename... Args>
  explicit Reported(Args&&... args) : E(std::forward<Args>(args)...) {}
};

}  // namespace comm::tcp
