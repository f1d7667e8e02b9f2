// What a piece of code writes to the process's standard error (the log's
// sink), for tests that check what a user is told there.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

namespace comm::testing {

// Runs `body` with file descriptor 2 redirected to a temporary file and
// returns what was written there meanwhile, by any thread of the process.
// Standard error is restored and the file removed even when `body` throws
// (a failed REQUIRE, say).
template <typename F>
std::string capture_stderr(F body) {
  char path[] = "/tmp/comm_stderr_XXXXXX";
  const int file = mkstemp(path);
  REQUIRE(file >= 0);
  std::fflush(stderr);
  const int saved = dup(2);
  REQUIRE(saved >= 0);
  REQUIRE(dup2(file, 2) == 2);
  struct Restore {
    int saved;
    int file;
    const char* path;
    ~Restore() {
      std::fflush(stderr);
      dup2(saved, 2);
      close(saved);
      close(file);
      unlink(path);
    }
  };
  std::string text;
  {
    const Restore restore{saved, file, path};
    body();
    std::fflush(stderr);
    std::ifstream in(path);
    std::stringstream read;
    read << in.rdbuf();
    text = read.str();
  }
  return text;
}

}  // namespace comm::testing
