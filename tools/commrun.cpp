// commrun: starts the ranks of a job on this host, as torchrun does.
//
//   commrun [--nproc-per-node N|auto|cpu|gpu] [--nnodes M] [--node-rank R]
//           [--master-addr HOST] [--master-port PORT] [--standalone]
//           [--rdzv-backend c10d|static] [--rdzv-endpoint HOST[:PORT]]
//           [--rdzv-id ID] [--rdzv-conf join_timeout=S] [--max-restarts K]
//           [--rdzv-timeout SECONDS] [--term-grace SECONDS]
//           [--python PATH] [-m|--module] [--run-path] [--no-python]
//           [--local-addr ADDR]
//           [--pass-local-rank [--local-rank-spelling underscore|dash]]
//           [--role NAME]
//           [--log-dir DIR] [-r|--redirects V] [-t|--tee V]
//           PROGRAM [ARGS...]
//
// torchrun's options are taken in both spellings (--nproc-per-node and
// --nproc_per_node). A PROGRAM ending in ".py" (or any PROGRAM with
// --module) runs under the Python interpreter (--python, /usr/bin/python3
// by default) with -u, as torchrun runs it under its own; any other
// PROGRAM is executed as it is. --pass-local-rank adds --local_rank=N (or
// --local-rank=N) before ARGS, for scripts written for
// torch.distributed.launch, which reads it from argv (launch's --use-env
// turned it off; commrun's default is the environment alone).
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK (the node rank), GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK,
// ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
// TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS (as torchrun
// sets them), COMM_RESTART_COUNT, COMM_RDZV_TIMEOUT (which env://
// rendezvous reads: --rdzv-timeout or join_timeout= where given, else the
// variable where commrun's own environment sets it, else 900),
// COMM_TCP_ADDR from --local-addr, and OMP_NUM_THREADS=1
// when it is unset and there is more than one worker (with torchrun's warning).
// Rank 0 hosts the store, so every restart is a fresh rendezvous.
//
// Every line a worker writes to stdout or stderr comes out on commrun's
// stdout or stderr prefixed with the worker's rank, "[3]: ...", written
// whole in one write(2), so lines of different workers never mix. A line
// longer than 64 KiB is cut into 64 KiB lines.
//
// Logs, as torchrun lays them out: with --log-dir DIR (or with -r or -t,
// which without DIR use a fresh TMPDIR/torchelastic_XXXXXX as torchrun
// does), commrun makes DIR/<run id>_XXXXXX once and says so, and each
// generation of workers (each restart) gets attempt_<restart>/<local
// rank>/ in it. -r V sends the chosen streams of each worker to stdout.log
// and stderr.log there instead of the console: V is 0 (none), 1 (stdout),
// 2 (stderr), 3 (both), or a map of local ranks to these, "0:1,1:2" (a
// local rank left out gets 0). A redirected stream is the file itself, so
// the worker's output reaches it even when commrun dies. -t V, with the
// same values, writes the chosen streams to the files as they are read and
// copies them to the console with torchrun's "[<role><local rank>]:"
// prefix.
//
// SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every worker; commrun
// then exits with 128 + the signal. When a worker fails (a non-zero status
// or a signal), commrun stops the others (SIGTERM, then SIGKILL after
// --term-grace), names the failed rank, and exits with its status (128 +
// signal for a signal), or, with --max-restarts K, starts the whole group
// again, at most K times. A worker that exits with 0 while others still run
// is not a failure, but its peers may then fail waiting for it: the summary
// names it first. Workers die with commrun even when it is SIGKILLed
// (PR_SET_PDEATHSIG). Each worker runs in its own process group, and
// signals go to the whole group, so what a worker started stops with it
// when the job is stopped, the failed worker's included; what is still in
// a group when the grace ends is killed. Being outside the terminal's
// foreground, a worker cannot read the terminal: one that tries stops on
// SIGTTIN, which fails the job with that explanation rather than hanging
// it. Bad arguments exit 2.
//
// With --nnodes > 1, run one commrun per node; each restarts its own
// workers, and a failure anywhere takes every rank down (the backends report
// failures to every peer), so the nodes restart together.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "libcomm/cuda.h"
#include "libcomm/detail/descriptors.h"
#include "libcomm/detail/socket.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 64 << 10;

// The signals commrun passes on to every worker before it exits with 128 +
// the signal.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

struct Config {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;
  int rdzv_timeout = 900;
  // Whether the workers get rdzv_timeout as COMM_RDZV_TIMEOUT: unless
  // --rdzv-timeout or join_timeout= gave it, a COMM_RDZV_TIMEOUT of
  // commrun's own environment passes to them unchanged.
  bool set_rdzv_timeout = true;
  int term_grace = 5;
  std::string run_id = "none";
  std::string role = "default";
  std::string local_addr;  // COMM_TCP_ADDR for the workers, when given
  // What each worker executes: the program (with the interpreter in front
  // for Python) and, after it, where --local_rank=N goes.
  std::vector<std::string> command;
  std::size_t local_rank_at = 0;
  std::string local_rank_flag;  // "--local_rank", "--local-rank" or empty
  bool set_omp_threads = false;
  // Per local rank, which streams go to the log files (kOut | kErr), and
  // which of those are also copied to the console.
  std::vector<int> redirects;
  std::vector<int> tee;
  std::string log_dir;  // this run's DIR/<run id>_XXXXXX, when logging
};

constexpr int kOut = 1;
constexpr int kErr = 2;

// One worker's output stream that commrun reads: bytes read so far that do
// not yet end a line, the prefix of its lines on the console, and, for
// --tee, the log file every byte read is written to at once (so that what
// was read is in the file whatever happens next).
struct Stream {
  int fd = -1;
  int target = STDOUT_FILENO;
  std::string pending;
  std::string prefix;
  int log_fd = -1;
  // Whether the last line emitted ended with a carriage return alone.
  bool drawing = false;
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  // Whether it has exited (waitid saw it), and whether it was reaped: until
  // then its zombie keeps its pid, the id of its process group, from being
  // taken by another process.
  bool exited = false;
  bool reaped = false;
  int status = 0;  // as waitpid gives it, once exited
  // SIGTTIN or SIGTTOU where it stopped on the terminal, which fails it.
  int stopped_by = 0;
  // The order in which workers exited, from 1.
  int exit_order = 0;
  Stream out;
  Stream err;
};

// How a generation of workers ended.
struct Outcome {
  int signal = 0;                  // one of kStopSignals, received by commrun
  const Worker* failed = nullptr;  // the first worker that failed
  // The first worker that exited with 0 while others still ran, before
  // `failed` failed: its peers may have failed for want of it.
  const Worker* left_early = nullptr;
  bool not_started = false;  // a worker could not be started
};

void write_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  // Bounded: every round writes bytes or gives up on an error other than
  // EINTR.
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report it: our own output is gone
    }
    done += static_cast<std::size_t>(n);
  }
}

void say(const std::string& message) {
  write_all(STDERR_FILENO, "commrun: " + message + "\n");
}

// Emits the complete lines of `stream` with the rank prefix; at EOF also the
// unfinished last line. A line ends at a newline, or at a carriage return,
// which it keeps, so that a progress bar redrawn with carriage returns
// moves as it is drawn, one prefix per drawing. A drawing left open (its
// carriage return was the last byte emitted) is closed, without a prefix
// of its own, by a newline that follows, and by the end of the stream.
void emit_lines(Stream& stream, bool at_eof) {
  const std::string& prefix = stream.prefix;
  const std::string& pending = stream.pending;
  std::string lines;
  std::size_t start = 0;
  while (true) {
    std::size_t end = pending.find_first_of("\r\n", start);
    std::string_view ending = "\n";
    std::size_t next = end + 1;
    if (end != std::string::npos && pending[end] == '\r') {
      ending = "\r";
      if (end + 1 < pending.size() && pending[end + 1] == '\n') {
        ending = "\r\n";
        next = end + 2;
      }
    }
    if (end == std::string::npos) {
      const std::size_t rest = pending.size() - start;
      if (rest >= kMaxLine) {
        end = start + kMaxLine;
      } else if (at_eof && rest > 0) {
        end = pending.size();
      } else {
        break;
      }
      next = end;
    }
    if (end == start && stream.drawing) {
      // Nothing to draw: a newline closes the open drawing, and another
      // carriage return leaves it open.
      if (ending != "\r") {
        lines += '\n';
        stream.drawing = false;
      }
    } else if (!(end == start && ending == "\r")) {
      lines += prefix;
      lines.append(pending, start, end - start);
      lines += ending;
      stream.drawing = ending == "\r";
    }
    start = next;
  }
  if (at_eof && stream.drawing) {
    lines += '\n';
    stream.drawing = false;
  }
  stream.pending.erase(0, start);
  if (!lines.empty()) write_all(stream.target, lines);
}

// A child's end as waitid reports it, in waitpid's form.
int wait_status_of(const siginfo_t& info) {
  switch (info.si_code) {
    case CLD_EXITED: return (info.si_status & 0xff) << 8;
    case CLD_DUMPED: return (info.si_status & 0x7f) | 0x80;
    default: return info.si_status & 0x7f;  // CLD_KILLED
  }
}

std::string describe_status(const Worker& w) {
  if (w.stopped_by != 0) {
    return std::string(w.stopped_by == SIGTTIN
                           ? "stopped on SIGTTIN, reading"
                           : "stopped on SIGTTOU, writing to") +
           " the terminal: workers run in process groups of their own, "
           "outside the terminal's foreground, so give the program its input "
           "from a file or a pipe (< FILE)";
  }
  const int status = w.status;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" +
           strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(const Worker& w) {
  if (w.stopped_by != 0) return 128 + w.stopped_by;
  return WIFSIGNALED(w.status) ? 128 + WTERMSIG(w.status)
                               : WEXITSTATUS(w.status);
}

bool failed(int status) {
  return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

[[noreturn]] void exec_worker(const Config& config, const Worker& worker,
                              int port, int restart, pid_t parent, int out,
                              int err, const sigset_t& blocked) {
  // Its own process group, so that stopping a worker stops what it started
  // too (a shell's children, say).
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // commrun died before prctl
  sigprocmask(SIG_UNBLOCK, &blocked, nullptr);
  dup2(out, STDOUT_FILENO);
  dup2(err, STDERR_FILENO);
  const int world = config.nproc_per_node * config.nnodes;
  auto set = [](const char* name, const std::string& value) {
    setenv(name, value.c_str(), 1);
  };
  set("RANK", std::to_string(worker.rank));
  set("LOCAL_RANK", std::to_string(worker.local_rank));
  set("WORLD_SIZE", std::to_string(world));
  set("LOCAL_WORLD_SIZE", std::to_string(config.nproc_per_node));
  set("GROUP_RANK", std::to_string(config.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(config.nnodes));
  set("ROLE_NAME", config.role);
  set("ROLE_RANK", std::to_string(worker.rank));
  set("ROLE_WORLD_SIZE", std::to_string(world));
  set("MASTER_ADDR", config.master_addr);
  set("MASTER_PORT", std::to_string(port));
  set("TORCHELASTIC_RUN_ID", config.run_id);
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(restart));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts));
  set("COMM_RESTART_COUNT", std::to_string(restart));
  if (config.set_rdzv_timeout) {
    set("COMM_RDZV_TIMEOUT", std::to_string(config.rdzv_timeout));
  }
  if (config.set_omp_threads) set("OMP_NUM_THREADS", "1");
  if (!config.local_addr.empty()) set("COMM_TCP_ADDR", config.local_addr);
  std::vector<std::string> args = config.command;
  if (!config.local_rank_flag.empty()) {
    args.insert(
        args.begin() + static_cast<std::ptrdiff_t>(config.local_rank_at),
        config.local_rank_flag + "=" + std::to_string(worker.local_rank));
  }
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const std::string message = "commrun: cannot run '" + config.command[0] +
                              "': " + std::strerror(errno) + "\n";
  write_all(STDERR_FILENO, message);
  _exit(127);
}

class Launcher {
 public:
  Launcher(const Config& config, int signal_fd, const sigset_t& blocked)
      : config_(config), signal_fd_(signal_fd), blocked_(blocked) {}

  // Runs one generation of workers to its end.
  Outcome run_generation(int port, int restart) {
    workers_.clear();
    exits_ = 0;
    workers_.resize(static_cast<std::size_t>(config_.nproc_per_node));
    // Up to four descriptors a worker: the read ends of its two pipes and
    // its two log files.
    comm::detail::raise_descriptor_limit(
        4 * static_cast<std::uint64_t>(config_.nproc_per_node) + 64);
    for (int local = 0; local < config_.nproc_per_node; ++local) {
      Worker& w = workers_[static_cast<std::size_t>(local)];
      w.local_rank = local;
      w.rank = config_.node_rank * config_.nproc_per_node + local;
      if (!spawn(w, port, restart)) {
        Outcome outcome;
        outcome.not_started = true;
        stop_all(SIGKILL);
        wait_out(outcome);
        return outcome;
      }
    }
    Outcome outcome;
    wait_out(outcome);
    return outcome;
  }

 private:
  // Sets up where one of w's streams goes: `child_fd` is what the worker
  // writes to, and `stream` what commrun reads, if anything. A redirected
  // stream is its log file; a teed one a pipe with the file beside it; any
  // other a pipe to the console.
  bool open_stream(const Worker& w, int which, const std::string& rank_dir,
                   Stream& stream, int& child_fd) {
    const auto local = static_cast<std::size_t>(w.local_rank);
    const bool logged = (config_.redirects[local] & which) != 0;
    const bool teed = (config_.tee[local] & which) != 0;
    stream = {};
    stream.target = which == kOut ? STDOUT_FILENO : STDERR_FILENO;
    if (logged) {
      const std::string path =
          rank_dir + (which == kOut ? "/stdout.log" : "/stderr.log");
      const int fd =
          open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return spawn_failed(("open " + path).c_str());
      if (!teed) {
        child_fd = fd;
        return true;
      }
      stream.log_fd = fd;
      stream.prefix = "[" + config_.role + std::to_string(w.local_rank) + "]:";
    } else {
      stream.prefix = "[" + std::to_string(w.rank) + "]: ";
    }
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0) {
      close_stream(stream);
      return spawn_failed("pipe");
    }
    stream.fd = ends[0];
    child_fd = ends[1];
    return true;
  }

  static void close_stream(Stream& stream) {
    for (int* fd : {&stream.fd, &stream.log_fd}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }

  bool spawn(Worker& w, int port, int restart) {
    std::string rank_dir;
    if (!config_.log_dir.empty()) {
      const std::string attempt =
          config_.log_dir + "/attempt_" + std::to_string(restart);
      rank_dir = attempt + "/" + std::to_string(w.local_rank);
      if (w.local_rank == 0 && mkdir(attempt.c_str(), 0755) != 0)
        return spawn_failed(("mkdir " + attempt).c_str());
      if (mkdir(rank_dir.c_str(), 0755) != 0)
        return spawn_failed(("mkdir " + rank_dir).c_str());
    }
    int out = -1, err = -1;
    if (!open_stream(w, kOut, rank_dir, w.out, out)) return false;
    if (!open_stream(w, kErr, rank_dir, w.err, err)) {
      close(out);
      close_stream(w.out);
      return false;
    }
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0)
      exec_worker(config_, w, port, restart, parent, out, err, blocked_);
    close(out);
    close(err);
    if (pid > 0) setpgid(pid, pid);  // whichever of the two runs first
    if (pid < 0) {
      close_stream(w.out);
      close_stream(w.err);
      return spawn_failed("fork");
    }
    w.pid = pid;
    return true;
  }

  static bool spawn_failed(const char* what) {
    say(std::string(what) + " failed: " + std::strerror(errno));
    return false;
  }

  // Signals every worker's process group, that is the worker with
  // whatever it started, including the group of a worker that has exited
  // (its zombie holds the group's id until wait_out reaps it), and
  // continues the group: a stopped process acts on a signal only once it
  // runs.
  void stop_all(int sig) {
    for (Worker& w : workers_) {
      if (w.pid <= 0 || w.reaped) continue;
      kill(-w.pid, sig);
      if (sig != SIGKILL) kill(-w.pid, SIGCONT);
    }
  }

  // Whether a process other than a zombie is left in the process group of
  // a worker of this generation, found in /proc.
  bool groups_left() const {
    std::error_code error;
    for (const auto& entry :
         std::filesystem::directory_iterator("/proc", error)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != name.npos) {
        continue;
      }
      std::FILE* file = std::fopen((entry.path() / "stat").c_str(), "r");
      if (file == nullptr) continue;
      char line[1024];
      const bool read = std::fgets(line, sizeof(line), file) != nullptr;
      std::fclose(file);
      // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
      const char* after = read ? std::strrchr(line, ')') : nullptr;
      char state = 0;
      long ppid = 0;
      long group = 0;
      if (after == nullptr ||
          std::sscanf(after + 1, " %c %ld %ld", &state, &ppid, &group) != 3 ||
          state == 'Z') {
        continue;
      }
      for (const Worker& w : workers_) {
        if (w.pid > 0 && !w.reaped && group == w.pid) return true;
      }
    }
    return false;
  }

  bool all_exited() const {
    return std::all_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.pid <= 0 || w.exited; });
  }

  // Learns which workers exited, leaving them unreaped (stop_all), and
  // which stopped on the terminal.
  void reap(Outcome& outcome, std::optional<Clock::time_point>& kill_at) {
    for (Worker& w : workers_) {
      if (w.pid <= 0 || w.exited) continue;
      siginfo_t info{};
      if (waitid(P_PID, static_cast<id_t>(w.pid), &info,
                 WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == w.pid) {
        w.exited = true;
        w.status = wait_status_of(info);
        w.exit_order = ++exits_;
        if (!failed(w.status) && !outcome.failed && !outcome.left_early &&
            !all_exited()) {
          outcome.left_early = &w;
        }
        if (failed(w.status)) fail(w, outcome, kill_at);
        continue;
      }
      // A worker outside the terminal's foreground that reads it (or writes
      // to it under `stty tostop`) stops, and would wait forever. Another
      // stop (SIGSTOP, a debugger) is the user's.
      info = {};
      if (w.stopped_by == 0 &&
          waitid(P_PID, static_cast<id_t>(w.pid), &info, WSTOPPED | WNOHANG) ==
              0 &&
          info.si_pid == w.pid &&
          (info.si_status == SIGTTIN || info.si_status == SIGTTOU)) {
        w.stopped_by = info.si_status;
        fail(w, outcome, kill_at);
      }
    }
  }

  // The first failure stops the others, which would only wait for it
  // until their timeouts.
  void fail(Worker& w, Outcome& outcome,
            std::optional<Clock::time_point>& kill_at) {
    if (outcome.failed != nullptr || outcome.signal != 0) return;
    outcome.failed = &w;
    stop_all(SIGTERM);
    kill_at = Clock::now() + std::chrono::seconds(config_.term_grace);
  }

  // Once every worker has exited: where the generation was stopped, waits
  // until what the workers started has left their process groups, until
  // the grace ends and then kills it; then reaps the workers. Bounded by
  // kill_at, at most --term-grace seconds away. A stop signal received
  // meanwhile ends the grace at once (and, being recorded, any restart).
  void finish(Outcome& outcome, std::optional<Clock::time_point> kill_at) {
    if (outcome.failed != nullptr || outcome.signal != 0) {
      // What ignores the signal that stopped the job (a shell's background
      // jobs ignore SIGINT and SIGQUIT) gets SIGTERM's chance too.
      if (outcome.signal != 0 && outcome.signal != SIGTERM && groups_left()) {
        stop_all(SIGTERM);
      }
      while (kill_at && Clock::now() < *kill_at && groups_left()) {
        pollfd signals{signal_fd_, POLLIN, 0};
        if (poll(&signals, 1, 20) != 1) continue;
        const std::vector<int> stops = read_stop_signals();
        if (stops.empty()) continue;
        if (outcome.signal == 0) {
          say(std::string(strsignal(stops.front())) +
              " received; killing what is left of the workers");
          outcome.signal = stops.front();
        }
        break;
      }
      if (groups_left()) stop_all(SIGKILL);
    }
    for (Worker& w : workers_) {
      if (w.pid <= 0 || w.reaped) continue;
      int status = 0;
      while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.reaped = true;
    }
  }

  // Relays output and reaps workers until every worker has exited and its
  // output is drained.
  void wait_out(Outcome& outcome) {
    std::optional<Clock::time_point> kill_at;
    std::optional<Clock::time_point> drain_until;
    // Bounded: workers exit on their own, or are killed at kill_at; after
    // the last one exits, output is drained for at most a second (a
    // grandchild may hold a pipe open forever).
    while (true) {
      if (all_exited()) {
        if (!drain_until) drain_until = Clock::now() + std::chrono::seconds(1);
        if (Clock::now() >= *drain_until) break;
      }
      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      std::vector<Stream*> owners{nullptr};
      for (Worker& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back(s);
        }
      }
      if (fds.size() == 1 && all_exited()) break;
      int timeout_ms = -1;
      const auto deadline = kill_at ? kill_at : drain_until;
      if (deadline) {
        timeout_ms = static_cast<int>(std::max<long long>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(
                   *deadline - Clock::now())
                       .count() +
                   1));
      }
      const int ready = poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        say(std::string("poll failed: ") + std::strerror(errno));
        stop_all(SIGKILL);
        kill_at.reset();
      }
      if (kill_at && Clock::now() >= *kill_at) {
        stop_all(SIGKILL);
        kill_at.reset();
      }
      if (ready <= 0) continue;
      if (fds[0].revents != 0) handle_signal(outcome, kill_at);
      for (std::size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        Stream* stream = owners[k];
        char buffer[16384];
        const ssize_t n = read(stream->fd, buffer, sizeof(buffer));
        if (n > 0) {
          if (stream->log_fd >= 0) {
            write_all(stream->log_fd,
                      std::string(buffer, static_cast<std::size_t>(n)));
          }
          stream->pending.append(buffer, static_cast<std::size_t>(n));
          emit_lines(*stream, false);
        } else if (n == 0 || errno != EINTR) {
          emit_lines(*stream, true);
          close_stream(*stream);
        }
      }
    }
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd < 0) continue;
        emit_lines(*s, true);
        close_stream(*s);
      }
    }
    finish(outcome, kill_at);
  }

  // The stop signals that arrived, in order, read from the signalfd; a
  // SIGCHLD is dropped (reap() asks every worker, whichever child it was).
  std::vector<int> read_stop_signals() {
    std::vector<int> stops;
    signalfd_siginfo info{};
    while (read(signal_fd_, &info, sizeof(info)) ==
           static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig != SIGCHLD) stops.push_back(sig);
    }
    return stops;
  }

  void handle_signal(Outcome& outcome,
                     std::optional<Clock::time_point>& kill_at) {
    for (const int sig : read_stop_signals()) {
      if (outcome.signal == 0) {
        say(std::string(strsignal(sig)) + " received; stopping the workers");
        outcome.signal = sig;
        kill_at = Clock::now() + std::chrono::seconds(config_.term_grace);
      }
      stop_all(sig);
    }
    reap(outcome, kill_at);
  }

  const Config& config_;
  int signal_fd_;
  const sigset_t& blocked_;
  std::vector<Worker> workers_;
  int exits_ = 0;
};

// torchrun's --nproc-per-node: a count, or "auto" (the GPUs, else the
// CPUs), "cpu" or "gpu". Empty when `text` is none of these.
std::optional<int> processes_per_node(const std::string& text,
                                      std::string& problem) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (text == "cpu" || (text == "auto" && comm::cuda_device_count() == 0)) {
    return static_cast<int>(std::clamp<long>(cpus, 1, 4096));
  }
  if (text == "gpu" || text == "auto") {
    const int gpus = comm::cuda_device_count();
    if (gpus == 0) {
      problem = "--nproc-per-node gpu: this build or machine has no CUDA GPU";
      return std::nullopt;
    }
    return gpus;
  }
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || n < 1 || n > 4096) {
    problem = "--nproc-per-node " + text +
              ": give a count from 1 to 4096, auto, cpu or gpu";
    return std::nullopt;
  }
  return static_cast<int>(n);
}

// torchrun's --redirects and --tee: one of 0 (none), 1 (stdout), 2
// (stderr), 3 (both) for every local rank, or LOCAL:V,... for some (the
// others get 0). Empty, with `problem` set, when `text` is neither or names
// a local rank twice or one this node does not have.
std::optional<std::vector<int>> streams_per_rank(const std::string& flag,
                                                 const std::string& text,
                                                 int nproc,
                                                 std::string& problem) {
  const auto bad = [&](const std::string& why) {
    if (problem.empty()) problem = flag + " " + text + ": " + why;
    return std::nullopt;
  };
  const std::string values =
      "give 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or a map of local "
      "ranks to these such as 0:1,1:2";
  if (std::regex_match(text, std::regex("[0-3]"))) {
    return std::vector<int>(static_cast<std::size_t>(nproc), text[0] - '0');
  }
  if (!std::regex_match(text, std::regex(R"((\d{1,6}:[0-3],)*\d{1,6}:[0-3])")))
    return bad(values);
  std::vector<int> chosen(static_cast<std::size_t>(nproc), 0);
  std::vector<bool> seen(static_cast<std::size_t>(nproc), false);
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const int local = std::stoi(item.substr(0, item.find(':')));
    if (local >= nproc) {
      return bad("local rank " + std::to_string(local) +
                 " is not below --nproc-per-node " + std::to_string(nproc));
    }
    if (seen[static_cast<std::size_t>(local)])
      return bad("local rank " + std::to_string(local) + " is given twice");
    seen[static_cast<std::size_t>(local)] = true;
    chosen[static_cast<std::size_t>(local)] = item.back() - '0';
  }
  return chosen;
}

// Makes this run's log directory, BASE/<run id>_XXXXXX, as torchrun does
// (BASE is made when missing; without one, a fresh TMPDIR/torchelastic_XXXXXX).
// Empty, with `problem` set, on failure.
std::string make_log_dir(std::string base, const std::string& run_id,
                         std::string& problem) {
  std::error_code error;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
        "/torchelastic_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      problem = "cannot make a log directory " + pattern + ": " +
                std::strerror(errno) + "; give one with --log-dir";
      return {};
    }
    base = pattern;
  } else if (std::filesystem::create_directories(base, error);
             error || !std::filesystem::is_directory(base)) {
    problem = "--log-dir " + base + ": cannot make the directory" +
              (error ? ": " + error.message() : "");
    return {};
  }
  std::string id = run_id;
  std::replace(id.begin(), id.end(), '/', '_');
  std::string pattern = base + "/" + id + "_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    problem = "--log-dir: cannot make " + pattern + ": " + std::strerror(errno);
    return {};
  }
  return pattern;
}

// A random run id for --standalone, as torchrun makes one.
std::string random_run_id() {
  std::random_device device;
  char text[40];
  std::snprintf(text, sizeof(text), "%08x-%04x-%04x", device(),
                device() & 0xffff, device() & 0xffff);
  return text;
}

int parse(int argc, char** argv, Config& config) {
  CLI::App app{"commrun: starts the ranks of a libcomm job, as torchrun does"};
  // CLI11 2.1 writes the usage line as "NAME [OPTIONS]" and has no setter
  // for it; the label inside the brackets carries the program and its
  // arguments, which prefix_command() leaves to us.
  app.get_formatter()->label("OPTIONS", "OPTIONS] PROGRAM [ARGS...");
  std::string nproc = "1";
  std::string nnodes = "1";
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::vector<std::string> rdzv_conf;
  std::string python = "/usr/bin/python3";
  bool pass_local_rank = false;
  std::string spelling = "underscore";
  bool standalone = false;
  bool module = false;
  bool run_path = false;
  bool no_python = false;
  bool use_env = false;
  double monitor_interval = 5;
  std::string start_method = "spawn";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                 "workers on this node: a count, auto (the GPUs, else the "
                 "CPUs), cpu or gpu")
      ->capture_default_str();
  app.add_option("--nnodes", nnodes,
                 "nodes in the job: N, or N:N (an elastic range MIN:MAX "
                 "with MIN < MAX is not supported)")
      ->capture_default_str();
  auto* node_rank = app.add_option("--node-rank,--node_rank", config.node_rank,
                                   "this node's rank, from 0")
                        ->check(CLI::Range(0, 65535))
                        ->capture_default_str();
  auto* master_addr = app.add_option("--master-addr,--master_addr",
                                     config.master_addr, "the host of rank 0")
                          ->capture_default_str();
  auto* master_port =
      app.add_option("--master-port,--master_port", config.master_port,
                     "rank 0's store port; 0 picks a free one (one node only)")
          ->check(CLI::Range(0, 65535))
          ->capture_default_str();
  app.add_flag("--standalone", standalone,
               "a job of this node alone: a free port on 127.0.0.1 and a "
               "random run id, as torchrun's --standalone");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "c10d or static: either way rank 0 hosts the store at "
                 "--rdzv-endpoint (or --master-addr:--master-port)")
      ->check(CLI::IsMember({"c10d", "static"}))
      ->capture_default_str();
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint,
                 "HOST[:PORT] of the store (port 29400 when left out), in "
                 "place of --master-addr and --master-port");
  auto* run_id = app.add_option("--rdzv-id,--rdzv_id", config.run_id,
                                "the job's id, TORCHELASTIC_RUN_ID")
                     ->capture_default_str();
  app.add_option("--rdzv-conf,--rdzv_conf", rdzv_conf,
                 "KEY=VALUE,...; join_timeout=SECONDS is --rdzv-timeout")
      ->delimiter(',');
  app.add_option("--max-restarts,--max_restarts", config.max_restarts,
                 "times to restart the group after a failure")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  auto* rdzv_timeout =
      app.add_option("--rdzv-timeout,--rdzv_timeout", config.rdzv_timeout,
                     "seconds the workers' rendezvous may take (unset: "
                     "COMM_RDZV_TIMEOUT where it is set, else 900)")
          ->check(CLI::Range(1, 1 << 30))
          ->capture_default_str();
  app.add_option("--term-grace", config.term_grace,
                 "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_option("--role", config.role, "the workers' role, ROLE_NAME")
      ->capture_default_str();
  app.add_option("--python", python,
                 "the interpreter of a .py PROGRAM or of --module")
      ->capture_default_str();
  app.add_option("--local-addr,--local_addr", config.local_addr,
                 "the address this node's ranks listen on (COMM_TCP_ADDR)");
  app.add_flag("--run-path,--run_path", run_path,
               "PROGRAM is a Python file whatever its name, as torchrun's "
               "--run-path");
  app.add_flag("-m,--module", module,
               "PROGRAM is a Python module, run as python -m PROGRAM");
  app.add_flag("--no-python,--no_python", no_python,
               "execute PROGRAM as it is, even when it ends in .py");
  app.add_flag("--pass-local-rank,--pass_local_rank", pass_local_rank,
               "add --local_rank=N before the program's arguments, as "
               "torch.distributed.launch does");
  app.add_option("--local-rank-spelling", spelling,
                 "underscore (--local_rank=N, torch 1.x's launch) or dash "
                 "(--local-rank=N, torch 2's)")
      ->check(CLI::IsMember({"underscore", "dash"}))
      ->capture_default_str();
  app.add_flag("--use-env,--use_env", use_env,
               "torch.distributed.launch's flag for what commrun does by "
               "default: the local rank in LOCAL_RANK only");
  app.add_option("--monitor-interval,--monitor_interval", monitor_interval,
                 "accepted for torchrun's command lines; commrun learns of "
                 "an exit at once, without polling")
      ->check(CLI::PositiveNumber);
  app.add_option("--start-method,--start_method", start_method,
                 "accepted for torchrun's command lines; workers are always "
                 "started with fork and exec")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
  app.add_option("--log-dir,--log_dir", log_dir,
                 "where the workers' logs go: DIR/<run id>_XXXXXX/"
                 "attempt_<restart>/<local rank>/{stdout,stderr}.log");
  app.add_option("-r,--redirects", redirects,
                 "streams that go to the log files instead of the console: "
                 "0 none, 1 stdout, 2 stderr, 3 both, or per local rank "
                 "(0:1,1:2)")
      ->capture_default_str();
  app.add_option("-t,--tee", tee,
                 "streams that go to the log files and to the console, "
                 "prefixed [<role><local rank>]: (values as --redirects)")
      ->capture_default_str();
  // Everything from the first argument that is not an option on is the
  // program and its arguments, untouched.
  app.prefix_command();
  app.footer("  PROGRAM [ARGS...]            what each worker runs");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // In the form of commrun's own argument errors (below).
    std::fprintf(stderr, "commrun: %s\nRun 'commrun --help' for the options.\n",
                 e.what());
    return 2;
  }
  std::vector<std::string> program = app.remaining();
  std::string problem;
  if (!program.empty() && program.front() == "--") {
    program.erase(program.begin());
  } else if (!program.empty() && program.front().size() > 1 &&
             program.front()[0] == '-') {
    problem = "unknown option " + program.front();
  }
  const auto nodes = nnodes.find(':');
  const std::string min_nodes = nnodes.substr(0, nodes);
  if (nodes != std::string::npos && nnodes.substr(nodes + 1) != min_nodes) {
    if (problem.empty())
      problem = "--nnodes " + nnodes +
                ": elastic ranges are not supported; give one count (N or "
                "N:N)";
  } else {
    char* end = nullptr;
    const long n = std::strtol(min_nodes.c_str(), &end, 10);
    if (min_nodes.empty() || *end != '\0' || n < 1 || n > 65536) {
      if (problem.empty())
        problem = "--nnodes " + nnodes + ": give a count from 1 to 65536";
    } else {
      config.nnodes = static_cast<int>(n);
    }
  }
  if (const auto n = processes_per_node(nproc, problem)) {
    config.nproc_per_node = *n;
  }
  bool given_rdzv_timeout = rdzv_timeout->count() > 0;
  for (const std::string& item : rdzv_conf) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    char* end = nullptr;
    const long seconds = eq == std::string::npos
                             ? 0
                             : std::strtol(item.c_str() + eq + 1, &end, 10);
    if (key == "join_timeout" && seconds > 0 && seconds <= (1 << 30) &&
        *end == '\0' && rdzv_timeout->count() == 0) {
      config.rdzv_timeout = static_cast<int>(seconds);
      given_rdzv_timeout = true;
    } else if (problem.empty()) {
      problem = "--rdzv-conf " + item +
                ": the one setting taken is join_timeout=SECONDS (and not "
                "together with --rdzv-timeout)";
    }
  }
  const char* inherited = std::getenv("COMM_RDZV_TIMEOUT");
  config.set_rdzv_timeout =
      given_rdzv_timeout || inherited == nullptr || *inherited == '\0';
  if (!rdzv_endpoint.empty()) {
    // HOST[:PORT], where an IPv6 HOST is in brackets when a port follows
    // ([::1]:29400), as torchrun reads it.
    std::string host = rdzv_endpoint;
    std::string port = "29400";
    if (rdzv_endpoint.front() == '[') {
      const auto close = rdzv_endpoint.find(']');
      host =
          close == std::string::npos ? "" : rdzv_endpoint.substr(1, close - 1);
      if (close != std::string::npos && close + 1 < rdzv_endpoint.size()) {
        port = rdzv_endpoint[close + 1] == ':' ? rdzv_endpoint.substr(close + 2)
                                               : "";
      }
    } else if (const auto colon = rdzv_endpoint.rfind(':');
               colon != std::string::npos) {
      host = rdzv_endpoint.substr(0, colon);
      port = rdzv_endpoint.substr(colon + 1);
    }
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (master_addr->count() > 0 || master_port->count() > 0) {
      if (problem.empty())
        problem =
            "--rdzv-endpoint and --master-addr/--master-port say the same "
            "thing; give one of them";
    } else if (host.empty() || port.empty() || *end != '\0' || p < 0 ||
               p > 65535) {
      if (problem.empty())
        problem = "--rdzv-endpoint " + rdzv_endpoint +
                  ": give HOST[:PORT], with an IPv6 HOST in brackets "
                  "([::1]:29400)";
    } else {
      config.master_addr = host;
      config.master_port = static_cast<int>(p);
    }
  }
  // MASTER_ADDR is a host name or an address, without an IPv6 address's
  // brackets.
  if (config.master_addr.size() > 2 && config.master_addr.front() == '[' &&
      config.master_addr.back() == ']') {
    config.master_addr =
        config.master_addr.substr(1, config.master_addr.size() - 2);
  }
  if (config.master_addr.empty() && problem.empty()) {
    problem = "--master-addr is empty: give the host of rank 0";
  }
  if (standalone) {
    if (config.nnodes != 1 || node_rank->count() > 0 ||
        !rdzv_endpoint.empty() || master_addr->count() > 0 ||
        master_port->count() > 0) {
      if (problem.empty())
        problem =
            "--standalone is a job of this node alone; it takes no --nnodes, "
            "--node-rank, --rdzv-endpoint, --master-addr or --master-port";
    }
    config.master_addr = "127.0.0.1";
    config.master_port = 0;
    if (run_id->count() == 0) config.run_id = random_run_id();
  }
  if ((module || run_path) && no_python && problem.empty()) {
    problem =
        "--module and --run-path run PROGRAM under Python; --no-python says "
        "not to";
  }
  const auto redirected = streams_per_rank("--redirects", redirects,
                                           config.nproc_per_node, problem);
  const auto teed =
      streams_per_rank("--tee", tee, config.nproc_per_node, problem);
  if (redirected && teed) {
    // As torchrun: a teed stream goes to its file too.
    config.redirects = *redirected;
    config.tee = *teed;
    for (std::size_t k = 0; k < config.tee.size(); ++k)
      config.redirects[k] |= config.tee[k];
  }
  if (pass_local_rank && use_env && problem.empty()) {
    problem =
        "--pass-local-rank puts the local rank in argv; --use-env says not to";
  }
  if (!problem.empty()) {
  } else if (program.empty()) {
    problem = "no program given";
  } else if (config.node_rank >= config.nnodes) {
    problem = "--node-rank " + std::to_string(config.node_rank) +
              " is not below --nnodes " + std::to_string(config.nnodes);
  } else if (config.master_port == 0 && config.nnodes > 1) {
    problem =
        "--master-port 0 picks a port on this node only; with --nnodes > 1 "
        "give every node the same port";
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "commrun: %s\nRun 'commrun --help' for the options.\n",
                 problem.c_str());
    return 2;
  }
  const bool logging =
      !log_dir.empty() ||
      std::any_of(config.redirects.begin(), config.redirects.end(),
                  [](int streams) { return streams != 0; });
  if (logging) {
    config.log_dir = make_log_dir(log_dir, config.run_id, problem);
    if (config.log_dir.empty()) {
      say(problem);
      return 1;
    }
    say("log directory set to: " + config.log_dir);
  }
  const std::string& first = program.front();
  const bool is_python_file =
      first.size() > 3 && first.compare(first.size() - 3, 3, ".py") == 0;
  if (module) {
    config.command = {python, "-u", "-m"};
  } else if ((is_python_file || run_path) && !no_python) {
    config.command = {python, "-u"};
  }
  config.local_rank_at = config.command.size() + 1;
  config.command.insert(config.command.end(), program.begin(), program.end());
  if (pass_local_rank) {
    config.local_rank_flag =
        spelling == "dash" ? "--local-rank" : "--local_rank";
  }
  if (config.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    config.set_omp_threads = true;
    say("OMP_NUM_THREADS is not set; each of the " +
        std::to_string(config.nproc_per_node) +
        " workers gets OMP_NUM_THREADS=1, so that they do not all start a "
        "thread per core and slow the machine down. Set it yourself to tune "
        "it for your program.");
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  if (const int code = parse(argc, argv, config); code >= 0) return code;

  // The signals arrive through signalfd, in the event loop; workers unblock
  // them before exec.
  sigset_t blocked;
  sigemptyset(&blocked);
  // SIGHUP (the terminal or the ssh session went away) and SIGQUIT stop the
  // workers as SIGINT and SIGTERM do, as under torchrun, rather than kill
  // commrun alone and leave the workers to PR_SET_PDEATHSIG's SIGKILL.
  for (const int sig : kStopSignals) sigaddset(&blocked, sig);
  sigaddset(&blocked, SIGCHLD);
  sigprocmask(SIG_BLOCK, &blocked, nullptr);
  const int signal_fd = signalfd(-1, &blocked, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) {
    say(std::string("signalfd failed: ") + std::strerror(errno));
    return 1;
  }

  Launcher launcher(config, signal_fd, blocked);
  for (int restart = 0;; ++restart) {
    // A fresh port per generation when picking: a new rendezvous cannot
    // meet an old one's leftovers.
    const int port = config.master_port != 0
                         ? config.master_port
                         : comm::detail::free_loopback_port();
    const Outcome outcome = launcher.run_generation(port, restart);
    // A signal that came after a failure stops the job too, once the
    // failure is named.
    if (outcome.signal != 0 && outcome.failed == nullptr) {
      return 128 + outcome.signal;
    }
    if (outcome.not_started) return 1;
    if (!outcome.failed) return 0;
    const Worker& w = *outcome.failed;
    if (outcome.left_early != nullptr) {
      // Its peers were likely left waiting in a collective for it: it is
      // where to look first, so it comes first.
      const Worker& early = *outcome.left_early;
      say("rank " + std::to_string(early.rank) + " (local rank " +
          std::to_string(early.local_rank) + ", pid " +
          std::to_string(early.pid) +
          ") exited with status 0 while other ranks were still running; "
          "ranks that wait for it in a collective fail (look at rank " +
          std::to_string(early.rank) + " first)");
    }
    say("rank " + std::to_string(w.rank) + " (local rank " +
        std::to_string(w.local_rank) + ", pid " + std::to_string(w.pid) + ") " +
        describe_status(w) +
        (outcome.left_early != nullptr
             ? ", after rank " + std::to_string(outcome.left_early->rank) +
                   " had exited"
             : ""));
    if (outcome.signal != 0) return 128 + outcome.signal;
    if (restart >= config.max_restarts) {
      if (config.max_restarts > 0) {
        say("giving up after " + std::to_string(config.max_restarts) +
            " restart" + (config.max_restarts == 1 ? "" : "s"));
      }
      return exit_code_of(w);
    }
    say("restarting the group (restart " + std::to_string(restart + 1) +
        " of " + std::to_string(config.max_restarts) + ")");
  }
}
