#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/logging.h"
#include "support/capture_stderr.h"

using comm::testing::capture_stderr;

namespace {

// The log level a fresh process reads from COMM_LOG_LEVEL=`value`, and
// whether it complained on stderr.
comm::LogLevel level_in_child(const char* value) {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    setenv("COMM_LOG_LEVEL", value, 1);
    _exit(static_cast<int>(comm::log_level()));
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  return static_cast<comm::LogLevel>(WEXITSTATUS(status));
}

}  // namespace

TEST_CASE("COMM_LOG_LEVEL sets the level; unknown values fall back to warn",
          "[logging]") {
  CHECK(level_in_child("debug") == comm::LogLevel::kDebug);
  CHECK(level_in_child("TRACE") == comm::LogLevel::kTrace);
  CHECK(level_in_child("off") == comm::LogLevel::kOff);
  CHECK(level_in_child("error") == comm::LogLevel::kError);
  CHECK(level_in_child("") == comm::LogLevel::kWarn);
  CHECK(level_in_child("loud") == comm::LogLevel::kWarn);
}

TEST_CASE("parse_log_level names the accepted values", "[logging]") {
  CHECK(comm::parse_log_level("Info") == comm::LogLevel::kInfo);
  CHECK_THROWS_WITH(
      comm::parse_log_level("verbose"),
      Catch::Contains("verbose") &&
          Catch::Contains("off, error, warn, info, debug, trace"));
}

TEST_CASE("each line carries host, pid and, once known, the rank",
          "[logging]") {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string origin = std::string(host) + ":" + std::to_string(getpid());
  comm::set_log_level(comm::LogLevel::kInfo);

  std::string before = capture_stderr([] { COMM_LOG_WARN("before {}", 1); });
  CHECK_THAT(before, Catch::Contains("[" + origin + "] before 1") &&
                         Catch::Contains("[warning]"));

  comm::set_log_rank(3);
  std::string after = capture_stderr([] {
    COMM_LOG_INFO("after {}", 2);
    COMM_LOG_DEBUG("hidden");  // below the level
  });
  CHECK_THAT(after, Catch::Contains("[" + origin + " rank 3] after 2"));
  CHECK_THAT(after, !Catch::Contains("hidden"));
  comm::set_log_rank(-1);
  comm::set_log_level(comm::LogLevel::kWarn);
}
