// Forked child processes for multi-process tests. Fork only from a process
// with a single thread (start servers inside children, not in the test
// process), so that the child inherits no lock some other thread held.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>

namespace comm::testing {

class ChildProcess {
 public:
  // Runs `body` in a child; its return value is the child's exit code, and
  // an exception escaping it prints the message and exits with 99.
  explicit ChildProcess(const std::function<int()>& body) {
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      int code = 99;
      try {
        code = body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
  }
  ~ChildProcess() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      reap(0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }
  void kill(int signal) { ::kill(pid_, signal); }

  // Waits up to `timeout` for the child to end. Returns its exit code, 128 +
  // the signal that ended it, or -1 when it is still running (it is then
  // killed, so that no test leaves processes behind).
  int wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    // Bounded by the deadline; each round sleeps, so this does not spin.
    while (std::chrono::steady_clock::now() < deadline) {
      if (reap(WNOHANG)) return status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (reap(WNOHANG)) return status_;
    ::kill(pid_, SIGKILL);
    reap(0);
    return -1;
  }

 private:
  bool reap(int flags) {
    if (reaped_) return true;
    int raw = 0;
    if (waitpid(pid_, &raw, flags) != pid_) return false;
    reaped_ = true;
    status_ = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    return true;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;
};

}  // namespace comm::testing
