#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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
  // In a child, whose limits the test may lower for good.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const rlimit soft_below{50, 60};
    setrlimit(RLIMIT_NOFILE, &soft_below);
    const std::string below = comm::SystemError(EMFILE, "accept").what();
    const rlimit at_hard{60, 60};
    setrlimit(RLIMIT_NOFILE, &at_hard);
    const std::string at = comm::SystemError(EMFILE, "accept").what();
    const bool right =
        below.starts_with("accept: Too many open files") &&
        below.find(
            "its limit of 50 open files, ulimit -n; raise it, up to "
            "the hard limit of 60") != std::string::npos &&
        at.find("its limit of 60 open files, which is also its hard limit") !=
            std::string::npos;
    _exit(right ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
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
