#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <cerrno>
#include <string>

#include "libcomm/error.h"
#include "libcomm/logging.h"

TEST_CASE("each error class reports its kind", "[error]") {
  CHECK(comm::InvalidArgument("x").kind() == comm::ErrorKind::kInvalidArgument);
  CHECK(comm::TimeoutError("x").kind() == comm::ErrorKind::kTimeout);
  CHECK(comm::MismatchError("x").kind() == comm::ErrorKind::kMismatch);
  CHECK(comm::BackendError("x").kind() == comm::ErrorKind::kBackend);
  CHECK(comm::UnsupportedError("x").kind() == comm::ErrorKind::kUnsupported);
  comm::PeerError peer(5, "rank 5 closed its connection");
  CHECK(peer.kind() == comm::ErrorKind::kPeer);
  CHECK(peer.peer_rank() == 5);
  comm::SystemError system(ECONNREFUSED, "connect to 127.0.0.1:1");
  CHECK(system.kind() == comm::ErrorKind::kSystem);
  CHECK(system.error_code() == ECONNREFUSED);
  CHECK_THAT(system.what(),
             Catch::Contains("127.0.0.1:1") && Catch::Contains("refused"));
}

TEST_CASE("a SystemError for want of descriptors names the limit to raise",
          "[error]") {
  rlimit files{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
  const std::string limit = files.rlim_cur == RLIM_INFINITY
                                ? "unlimited"
                                : std::to_string(files.rlim_cur);
  CHECK_THAT(
      comm::SystemError(EMFILE, "accept").what(),
      Catch::StartsWith("accept: Too many open files") &&
          Catch::Contains("its limit of " + limit + " open files, ulimit -n"));
  CHECK_THAT(comm::SystemError(ENFILE, "socket").what(),
             Catch::Contains("fs.file-max"));
  CHECK_THAT(comm::SystemError(EPIPE, "send").what(),
             !Catch::Contains("open files"));
}

TEST_CASE("all of them are caught as comm::Error and std::exception",
          "[error]") {
  CHECK_THROWS_AS(throw comm::PeerError(1, "gone"), comm::Error);
  CHECK_THROWS_AS(throw comm::TimeoutError("late"), std::runtime_error);
  // Code written before UnsupportedError existed still catches it.
  CHECK_THROWS_AS(throw comm::UnsupportedError("no"), comm::InvalidArgument);
}

TEST_CASE("errors from other processes or timing name COMM_LOG_LEVEL",
          "[error]") {
  comm::set_log_level(comm::LogLevel::kWarn);
  CHECK_THAT(comm::TimeoutError("barrier timed out").what(),
             Catch::StartsWith("barrier timed out") &&
                 Catch::Contains("COMM_LOG_LEVEL=debug"));
  CHECK_THAT(comm::PeerError(2, "x").what(), Catch::Contains("COMM_LOG_LEVEL"));
  // The caller's own mistake needs no log to understand.
  CHECK_THAT(comm::InvalidArgument("bad dtype").what(),
             Catch::Equals("bad dtype"));
  // When debug lines are already on, the hint would be noise.
  comm::set_log_level(comm::LogLevel::kDebug);
  CHECK_THAT(comm::TimeoutError("late").what(), Catch::Equals("late"));
  comm::set_log_level(comm::LogLevel::kWarn);
}
