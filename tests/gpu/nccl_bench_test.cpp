// The bench binaries with --backend nccl, as a user measuring NCCL runs
// them: each must time its collective on CUDA buffers at world size 1 and
// find every value right. The binaries are started with posix_spawn, which
// is safe in this process that CUDA has already given threads.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_path.h"

using namespace std::chrono_literals;

extern char** environ;

namespace {

struct Run {
  int status = -1;  // the exit code, 128 + a signal, or -1 when it hung
  std::string output;
};

// Runs `argv` with stdout and stderr going to a file, for at most
// `timeout`; a program still running then is killed.
Run run_program(const std::vector<std::string>& argv,
                std::chrono::milliseconds timeout) {
  comm::testing::TempPath log("nccl_bench");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.str().c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned =
      posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(spawned == 0);

  Run run;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int wait_status = 0;
  // Bounded by the deadline; each round sleeps.
  while (waitpid(pid, &wait_status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &wait_status, 0);
      wait_status = -1;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  if (wait_status != -1) {
    run.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status)
                                        : 128 + WTERMSIG(wait_status);
  }
  std::ifstream in(log.str());
  std::stringstream text;
  text << in.rdbuf();
  run.output = text.str();
  return run;
}

}  // namespace

TEST_CASE("every bench binary runs and checks its collective over NCCL",
          "[gpu][nccl][bench]") {
  const char* dir = std::getenv("COMM_BENCH_DIR");
  REQUIRE(dir != nullptr);
  for (const char* name :
       {"all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter",
        "alltoall", "gather", "scatter", "sendrecv"}) {
    const Run run = run_program(
        {std::string(dir) + "/" + name + "_perf", "--backend", "nccl", "-b",
         "8", "-e", "4M", "-f", "64", "-n", "5", "-w", "2", "-c", "1"},
        60s);
    INFO(name << "_perf:\n" << run.output);
    CHECK(run.status == 0);
    CHECK_THAT(run.output,
               Catch::Contains("backend cpu:tcp,cuda:nccl, CUDA memory") &&
                   Catch::Contains("device cuda:0") &&
                   Catch::Contains("# Out of bounds values : 0 OK"));
  }
}
