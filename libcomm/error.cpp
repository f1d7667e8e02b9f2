#include "libcomm/error.h"

#include <cstdio>
#include <system_error>

#include "libcomm/detail/descriptors.h"
#include "libcomm/logging.h"

namespace comm {

Error::Error(const std::string& message) : std::runtime_error(message) {}
Error::~Error() = default;

InvalidArgument::InvalidArgument(const std::string& message) : Error(message) {}
ErrorKind InvalidArgument::kind() const noexcept {
  return ErrorKind::kInvalidArgument;
}

UnsupportedError::UnsupportedError(const std::string& message)
    : InvalidArgument(message) {}
ErrorKind UnsupportedError::kind() const noexcept {
  return ErrorKind::kUnsupported;
}

TimeoutError::TimeoutError(const std::string& message)
    : Error(with_log_hint(message)) {}
ErrorKind TimeoutError::kind() const noexcept { return ErrorKind::kTimeout; }

PeerError::PeerError(int peer_rank, const std::string& message)
    : Error(with_log_hint(message)), peer_rank_(peer_rank) {}
ErrorKind PeerError::kind() const noexcept { return ErrorKind::kPeer; }

MismatchError::MismatchError(const std::string& message)
    : Error(with_log_hint(message)) {}
ErrorKind MismatchError::kind() const noexcept { return ErrorKind::kMismatch; }

BackendError::BackendError(const std::string& message)
    : Error(with_log_hint(message)) {}
ErrorKind BackendError::kind() const noexcept { return ErrorKind::kBackend; }

SystemError::SystemError(int error_code, const std::string& what_failed)
    : Error(what_failed + ": " + std::system_category().message(error_code) +
            detail::descriptor_limit_hint(error_code)),
      error_code_(error_code) {}
ErrorKind SystemError::kind() const noexcept { return ErrorKind::kSystem; }

std::string with_log_hint(std::string message) {
  // A message relayed from another rank may carry the hint already.
  if (log_level() > LogLevel::kDebug &&
      message.find("COMM_LOG_LEVEL=") == std::string::npos) {
    message += " (set COMM_LOG_LEVEL=debug to see what led up to this)";
  }
  return message;
}

std::string format_duration(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  if (ms < 10000) return std::to_string(ms) + " ms";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms) / 1000);
  return text;
}

}  // namespace comm
