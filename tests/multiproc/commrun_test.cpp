// commrun, the launcher: what it exports, how it relays output, and how it
// ends a job (a failing worker, restarts, signals, bad arguments). Workers
// are small shell scripts; one test runs a real libcomm job under it. The
// bench binaries' own launcher (-np) is checked here too, for how it
// places its ranks on CPUs and how it ends them once one failed.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support/child_process.h"
#include "support/env_is.h"
#include "support/temp_path.h"

using comm::testing::ChildProcess;
using comm::testing::EnvIs;
using comm::testing::TempPath;
using namespace std::chrono_literals;

namespace {

std::string from_env(const char* name) {
  const char* value = std::getenv(name);
  REQUIRE(value != nullptr);
  return value;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A scratch directory for the workers' files, removed at the end.
struct ScratchDir {
  TempPath path{"commrun"};
  ScratchDir() { REQUIRE(mkdir(path.str().c_str(), 0700) == 0); }
  ~ScratchDir() {
    const std::string command = "rm -rf '" + path.str() + "'";
    (void)!std::system(command.c_str());
  }
  std::string operator/(const std::string& name) const {
    return path.str() + "/" + name;
  }
};

// commrun with `args`, its stdout and stderr going to files in `dir`.
// Runs `binary` with `args`, its stdout and stderr going to files in `dir`.
std::unique_ptr<ChildProcess> start_program(const ScratchDir& dir,
                                            const std::string& binary,
                                            std::vector<std::string> args) {
  const std::string out = dir / "stdout";
  const std::string err = dir / "stderr";
  return std::make_unique<ChildProcess>([=]() {
    const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    return 98;
  });
}

std::unique_ptr<ChildProcess> start_commrun(const ScratchDir& dir,
                                            std::vector<std::string> args) {
  return start_program(dir, from_env("COMMRUN_BIN"), std::move(args));
}

// Waits (bounded, sleeping) until `count` files named pid.* exist in `dir`
// and returns the pids they hold.
std::vector<pid_t> wait_for_pids(const ScratchDir& dir, int count) {
  std::vector<pid_t> pids;
  for (int round = 0; round < 1000; ++round) {  // at most 10 s
    pids.clear();
    for (int r = 0; r < count; ++r) {
      const std::string text = read_file(dir / ("pid." + std::to_string(r)));
      if (!text.empty() && text.back() == '\n') pids.push_back(std::stoi(text));
    }
    if (static_cast<int>(pids.size()) == count) return pids;
    std::this_thread::sleep_for(10ms);
  }
  FAIL("the workers did not all start within 10 s");
  return pids;
}

bool alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// Whether `pid` runs, not counting a zombie: an orphan's zombie waits for
// an init that may never reap it (a container's).
bool running(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         stat[close + 2] != 'Z';
}

// A worker that records its pid and then sleeps (exec, so the pid is the
// sleeping process's).
std::string sleeper(const ScratchDir& dir) {
  return "echo $$ > " + dir.path.str() + "/pid.$RANK.tmp && mv " +
         dir.path.str() + "/pid.$RANK.tmp " + dir.path.str() +
         "/pid.$RANK; exec sleep 60";
}

}  // namespace

TEST_CASE("a carriage return ends a drawing of a progress bar", "[commrun]") {
  // tqdm starts each drawing with a carriage return; a Windows line ends
  // with one before its newline; the last drawing may end the output.
  ScratchDir dir;
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "1", "--master-port", "0", "sh", "-c",
            "printf 'start\\n'; printf '\\rstep 1'; sleep 0.2; "
            "printf '\\rstep 2'; sleep 0.2; printf '\\n'; "
            "printf 'dos\\r\\n'; printf 'last\\r'"});
  REQUIRE(commrun->wait(20s) == 0);
  CHECK(read_file(dir / "stdout") ==
        "[0]: start\n[0]: step 1\r[0]: step 2\n[0]: dos\r\n[0]: last\r\n");

  // A drawing that ends with its carriage return shows at once, not when
  // the next one comes.
  ScratchDir later;
  auto drawing =
      start_commrun(later, {"--nproc-per-node", "1", "--master-port", "0", "sh",
                            "-c", "printf '10%%\\r'; exec sleep 60"});
  bool shown = false;
  for (int round = 0; round < 1000 && !shown; ++round) {  // at most 10 s
    shown = read_file(later / "stdout") == "[0]: 10%\r";
    if (!shown) std::this_thread::sleep_for(10ms);
  }
  CHECK(shown);
  drawing->kill(SIGTERM);
  CHECK(drawing->wait(20s) == 128 + SIGTERM);
  CHECK(read_file(later / "stdout") == "[0]: 10%\r\n");
}

TEST_CASE("commrun exports torchrun's variables to each worker", "[commrun]") {
  ScratchDir dir;
  auto commrun = start_commrun(
      dir,
      {"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1",
       "--master-addr", "127.0.0.1", "--master-port", "29999", "--rdzv-timeout",
       "42", "sh", "-c",
       "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
       "$MASTER_ADDR $MASTER_PORT $COMM_RESTART_COUNT $COMM_RDZV_TIMEOUT"});
  REQUIRE(commrun->wait(20s) == 0);
  auto lines = lines_of(read_file(dir / "stdout"));
  std::sort(lines.begin(), lines.end());
  CHECK(lines ==
        std::vector<std::string>{"[3]: 3 0 6 3 1 127.0.0.1 29999 0 42",
                                 "[4]: 4 1 6 3 1 127.0.0.1 29999 0 42",
                                 "[5]: 5 2 6 3 1 127.0.0.1 29999 0 42"});
}

TEST_CASE("commrun prefixes every line and never breaks one", "[commrun]") {
  ScratchDir dir;
  // awk writes through a buffer, so lines reach commrun cut at arbitrary
  // points and interleaved with the other workers' bytes.
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "4", "--master-port", "0", "sh", "-c",
            "awk 'BEGIN { for (i = 0; i < 3000; i++) { printf \"%s:%d:\", "
            "ENVIRON[\"RANK\"], i; for (j = 0; j < 300; j++) printf \"x\"; "
            "printf \"\\n\" } printf \"unfinished\" }'; echo oops >&2"});
  REQUIRE(commrun->wait(60s) == 0);
  const std::regex line_form(R"(\[(\d)\]: (\d):(\d+):x{300})");
  std::vector<int> next(4, 0);
  int unfinished = 0;
  for (const auto& line : lines_of(read_file(dir / "stdout"))) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"(\[(\d)\]: unfinished)"))) {
      ++unfinished;
      continue;
    }
    INFO(line.substr(0, 80));
    REQUIRE(std::regex_match(line, m, line_form));
    REQUIRE(m[1] == m[2]);
    const int rank = std::stoi(m[1]);
    // Each worker's lines arrive whole and in order.
    CHECK(std::stoi(m[3]) == next[static_cast<std::size_t>(rank)]++);
  }
  CHECK(next == std::vector<int>(4, 3000));
  CHECK(unfinished == 4);
  auto errors = lines_of(read_file(dir / "stderr"));
  // commrun's own line about OMP_NUM_THREADS, unless the caller set it.
  std::erase_if(errors, [](const std::string& line) {
    return line.rfind("commrun: OMP_NUM_THREADS", 0) == 0;
  });
  std::sort(errors.begin(), errors.end());
  CHECK(errors == std::vector<std::string>{"[0]: oops", "[1]: oops",
                                           "[2]: oops", "[3]: oops"});
}

TEST_CASE("a failing worker's status ends the job and stops the others",
          "[commrun]") {
  ScratchDir dir;
  // Rank 1 fails with 7 once every rank is up; the others sleep.
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then echo $$ > " + dir.path.str() +
      "/pid.1; i=0; while [ $i -lt 500 ] && ! [ -e " + dir.path.str() +
      "/pid.0 -a -e " + dir.path.str() + "/pid.2 ]; do sleep 0.02; " +
      "i=$((i+1)); done; exit 7; fi; " + sleeper(dir);
  const auto start = std::chrono::steady_clock::now();
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "3", "--master-port", "0", "sh", "-c", script});
  const auto pids = wait_for_pids(dir, 3);
  CHECK(commrun->wait(20s) == 7);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  for (pid_t pid : pids) CHECK_FALSE(alive(pid));
  const std::string err = read_file(dir / "stderr");
  CHECK_THAT(
      err, Catch::Contains("rank 1 (local rank 1, pid " +
                           std::to_string(pids[1]) + ") exited with status 7"));

  // A worker killed by a signal: 128 + the signal.
  ScratchDir dir2;
  auto killed = start_commrun(
      dir2, {"--nproc-per-node", "2", "--master-port", "0", "sh", "-c",
             "[ \"$RANK\" = 0 ] && kill -9 $$; "
             "exec sleep 60"});
  CHECK(killed->wait(20s) == 128 + SIGKILL);
  CHECK_THAT(read_file(dir2 / "stderr"),
             Catch::Contains("rank 0 (local rank 0") &&
                 Catch::Contains("killed by signal 9"));
}

TEST_CASE(
    "what every worker started is stopped with the job (the failed one's too)",
    "[commrun]") {
  // Every rank starts a helper in the background (as a data loader
  // would), which records its pid; once all have, rank 1 fails. With
  // `trap`, the helpers ignore SIGTERM, so only the SIGKILL at the end of
  // the grace stops them.
  for (const bool ignores_term : {false, true}) {
    INFO("helpers ignore SIGTERM: " << ignores_term);
    ScratchDir dir;
    const std::string helper =
        std::string("sh -c '") + (ignores_term ? "trap \"\" TERM; " : "") +
        "echo $$ > " + dir.path.str() + "/pid.$RANK.tmp && mv " +
        dir.path.str() + "/pid.$RANK.tmp " + dir.path.str() +
        "/pid.$RANK; sleep 60 & wait' &";
    const std::string script =
        helper +
        " if [ \"$RANK\" = 1 ]; then i=0; while [ $i -lt 500 ] && ! [ -e " +
        dir.path.str() + "/pid.0 -a -e " + dir.path.str() +
        "/pid.1 ]; do sleep 0.02; i=$((i+1)); done; exit 3; fi; exec sleep 60";
    const auto start = std::chrono::steady_clock::now();
    auto commrun =
        start_commrun(dir, {"--nproc-per-node", "2", "--master-port", "0",
                            "--term-grace", "1", "sh", "-c", script});
    const auto helpers = wait_for_pids(dir, 2);
    CHECK(commrun->wait(20s) == 3);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    for (pid_t pid : helpers) CHECK_FALSE(running(pid));
  }
}

TEST_CASE("a signal while the grace runs ends it and any restart",
          "[commrun]") {
  // Rank 0 leaves a helper that ignores SIGTERM and SIGINT behind and
  // fails; commrun would give the helper 60 s and then restart. SIGINT
  // ends that at once: the failure is named, nothing restarts, and the
  // helper is killed.
  ScratchDir dir;
  const std::string script =
      "if [ \"$RANK\" = 0 ]; then sh -c 'trap \"\" TERM INT; echo $$ > " +
      dir.path.str() + "/pid.tmp && mv " + dir.path.str() + "/pid.tmp " +
      dir.path.str() +
      "/pid.0; sleep 60 & wait' >/dev/null 2>&1 & i=0; while [ $i -lt 500 ] "
      "&& ! [ -e " +
      dir.path.str() + "/pid.0 ]; do sleep 0.02; i=$((i+1)); done; echo $$ > " +
      dir.path.str() + "/pid.tmp && mv " + dir.path.str() + "/pid.tmp " +
      dir.path.str() + "/pid.1; exit 1; fi; exec sleep 60";
  const auto start = std::chrono::steady_clock::now();
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "2", "--master-port", "0", "--term-grace", "60",
            "--max-restarts", "3", "sh", "-c", script});
  // pid.0 is the helper's, pid.1 rank 0's, written as it fails.
  const auto pids = wait_for_pids(dir, 2);
  for (int round = 0; round < 1000 && running(pids[1]); ++round) {
    std::this_thread::sleep_for(10ms);  // at most 10 s
  }
  std::this_thread::sleep_for(200ms);  // for commrun to see it
  commrun->kill(SIGINT);
  CHECK(commrun->wait(30s) == 128 + SIGINT);
  CHECK(std::chrono::steady_clock::now() - start < 30s);
  CHECK_FALSE(running(pids[0]));
  const std::string err = read_file(dir / "stderr");
  CHECK_THAT(err, Catch::Contains("exited with status 1"));
  CHECK_THAT(err, !Catch::Contains("restarting the group"));
}

TEST_CASE("a worker that reads the terminal fails the job saying why",
          "[commrun]") {
  // commrun in the foreground of a terminal of its own; its worker, in a
  // process group of its own, reads it and stops on SIGTTIN.
  ScratchDir dir;
  const int terminal = posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(terminal >= 0);
  REQUIRE(grantpt(terminal) == 0);
  REQUIRE(unlockpt(terminal) == 0);
  const std::string side = ptsname(terminal);
  const std::string binary = from_env("COMMRUN_BIN");
  const std::string err = dir / "stderr";
  ChildProcess commrun([&]() {
    setsid();
    const int tty = open(side.c_str(), O_RDWR);  // the controlling terminal
    const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (tty < 0 || err_fd < 0) return 97;
    dup2(tty, STDIN_FILENO);
    dup2(tty, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execl(binary.c_str(), binary.c_str(), "--nproc-per-node", "1",
          "--master-port", "0", "sh", "-c", "read answer; echo got $answer",
          nullptr);
    return 98;
  });
  CHECK(commrun.wait(20s) == 128 + SIGTTIN);
  close(terminal);
  CHECK_THAT(read_file(err),
             Catch::Contains("rank 0 (local rank 0") &&
                 Catch::Contains("stopped on SIGTTIN, reading the terminal") &&
                 Catch::Contains("from a file or a pipe"));
}

TEST_CASE("--rdzv-endpoint takes an IPv6 host in brackets", "[commrun]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[::1]:29611", "[0]: ::1 29611"},
      {"[::1]", "[0]: ::1 29400"},
      {"node7:1234", "[0]: node7 1234"},
      {"node7", "[0]: node7 29400"}};
  for (const auto& [endpoint, expected] : cases) {
    INFO(endpoint);
    ScratchDir dir;
    auto commrun = start_commrun(
        dir, {"--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "sh", "-c",
              "echo $MASTER_ADDR $MASTER_PORT"});
    REQUIRE(commrun->wait(20s) == 0);
    CHECK(lines_of(read_file(dir / "stdout")) ==
          std::vector<std::string>{expected});
  }
  for (const std::string bad : {"[::1", "[::1]29611", "[]:1"}) {
    INFO(bad);
    ScratchDir dir;
    auto commrun = start_commrun(
        dir, {"--nproc-per-node", "1", "--rdzv-endpoint", bad, "true"});
    CHECK(commrun->wait(20s) == 2);
    CHECK_THAT(read_file(dir / "stderr"),
               Catch::Contains("with an IPv6 HOST in brackets"));
  }
}

TEST_CASE("--max-restarts K restarts the group exactly K times", "[commrun]") {
  ScratchDir dir;
  // Rank 0 always fails; rank 1 waits to be stopped. Each start of rank 0
  // appends its restart count.
  const std::string script =
      "if [ \"$RANK\" = 0 ]; then echo "
      "$COMM_RESTART_COUNT >> " +
      dir.path.str() + "/starts; exit 3; fi; exec sleep 60";
  auto commrun =
      start_commrun(dir, {"--nproc-per-node", "2", "--master-port", "0",
                          "--max-restarts", "2", "sh", "-c", script});
  CHECK(commrun->wait(30s) == 3);
  CHECK(lines_of(read_file(dir / "starts")) ==
        std::vector<std::string>{"0", "1", "2"});
  const std::string err = read_file(dir / "stderr");
  CHECK_THAT(err, Catch::Contains("restarting the group (restart 2 of 2)") &&
                      Catch::Contains("giving up after 2 restarts"));

  // A group that succeeds on its second start: no more restarts than that.
  // Only rank 0 fails, so that it is never stopped before it has counted
  // its start.
  ScratchDir dir2;
  const std::string flaky =
      "echo x >> " + dir2.path.str() +
      "/starts.$RANK; ! [ $RANK = 0 -a $COMM_RESTART_COUNT = 0 ]";
  auto recovered =
      start_commrun(dir2, {"--nproc-per-node", "2", "--master-port", "0",
                           "--max-restarts", "5", "sh", "-c", flaky});
  CHECK(recovered->wait(30s) == 0);
  CHECK(lines_of(read_file(dir2 / "starts.0")).size() == 2);
}

TEST_CASE(
    "SIGTERM SIGINT SIGHUP and SIGQUIT to commrun each leave no worker alive",
    "[commrun]") {
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    INFO(strsignal(sig));
    ScratchDir dir;
    auto commrun = start_commrun(dir, {"--nproc-per-node", "3", "--master-port",
                                       "0", "sh", "-c", sleeper(dir)});
    const auto pids = wait_for_pids(dir, 3);
    commrun->kill(sig);
    CHECK(commrun->wait(10s) == 128 + sig);
    for (pid_t pid : pids) CHECK_FALSE(alive(pid));
  }
}

TEST_CASE("commrun rejects bad arguments with a usage message and 2",
          "[commrun]") {
  const std::vector<std::vector<std::string>> bad = {
      {"--nproc-per-node", "0", "true"},
      {"--nproc-per-node", "two", "true"},
      {"--frobnicate", "true"},
      {"--nproc-per-node", "2"},
      {"--nnodes", "2", "--node-rank", "2", "true"},
      {"--nnodes", "2", "--master-port", "0", "true"},
      {"--master-port", "70000", "true"},
      {"--nnodes", "1:4", "true"},
      {"--rdzv-backend", "etcd", "true"},
      {"--standalone", "--nnodes", "2", "true"},
      {"--nproc-per-node", "zero", "true"},
      {"--rdzv-endpoint", "127.0.0.1:1", "--master-port", "2", "true"},
      {"--rdzv-conf", "read_timeout=5", "true"},
      {"--pass-local-rank", "--use-env", "true"},
      {"--master-addr", "", "true"},
  };
  for (const auto& args : bad) {
    ScratchDir dir;
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    INFO(joined);
    auto commrun = start_commrun(dir, args);
    CHECK(commrun->wait(10s) == 2);
    // Each in commrun's form, whether commrun or its parser found it.
    const std::string err = read_file(dir / "stderr");
    CHECK(err.starts_with("commrun: "));
    CHECK_THAT(err, Catch::Contains("Run 'commrun --help' for the options."));
  }
}

TEST_CASE("a worker that exits 0 while others run is named first",
          "[commrun]") {
  ScratchDir dir;
  // Rank 0 leaves at once with 0; rank 1 fails once it has seen rank 0 go,
  // as a peer left waiting in a collective does; rank 2 waits to be stopped.
  const std::string script =
      "if [ \"$RANK\" = 0 ]; then echo $$ > " + dir.path.str() +
      "/pid.0; exit 0; fi; if [ \"$RANK\" = 1 ]; then i=0; while [ $i -lt 500 "
      "] && ! [ -e " +
      dir.path.str() +
      "/pid.0 ]; do sleep 0.02; i=$((i+1)); "
      "done; sleep 0.3; exit 4; fi; exec sleep 60";
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "3", "--master-port", "0", "sh", "-c", script});
  CHECK(commrun->wait(30s) == 4);
  const std::string pid0 = read_file(dir / "pid.0");
  const auto lines = lines_of(read_file(dir / "stderr"));
  std::vector<std::string> summary;
  for (const auto& line : lines) {
    if (line.rfind("commrun: rank", 0) == 0) summary.push_back(line);
  }
  INFO(read_file(dir / "stderr"));
  REQUIRE(summary.size() == 2);
  // The rank that left comes first, then the one that failed for it.
  CHECK_THAT(summary[0],
             Catch::StartsWith("commrun: rank 0 (local rank 0, pid " +
                               pid0.substr(0, pid0.size() - 1) +
                               ") exited with status 0 while other ranks "
                               "were still running"));
  CHECK_THAT(summary[1], Catch::Contains("rank 1 (local rank 1") &&
                             Catch::Contains("exited with status 4") &&
                             Catch::Contains("after rank 0 had exited"));

  // Every rank exiting 0 is a success with no such line.
  ScratchDir dir2;
  auto fine =
      start_commrun(dir2, {"--nproc-per-node", "3", "--master-port", "0", "sh",
                           "-c", "[ $RANK = 0 ] || sleep 0.3"});
  CHECK(fine->wait(30s) == 0);
  CHECK_THAT(read_file(dir2 / "stderr"),
             !Catch::Contains("exited with status 0"));
}

TEST_CASE("commrun runs a .py program under Python and executables as they are",
          "[commrun]") {
  ScratchDir dir;
  const std::string script = dir / "show.py";
  {
    std::ofstream out(script);
    out << "import os, sys\nprint(sys.executable, os.environ['RANK'], "
           "*sys.argv[1:])\n";
  }  // not executable: it must be given to the interpreter
  auto python = start_commrun(
      dir, {"--nproc_per_node", "2", "--master-port", "0", script, "a", "b"});
  REQUIRE(python->wait(60s) == 0);
  auto lines = lines_of(read_file(dir / "stdout"));
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"[0]: /usr/bin/python3 0 a b",
                                          "[1]: /usr/bin/python3 1 a b"});

  // --run-path: a Python file whatever its name.
  ScratchDir dir4;
  const std::string unnamed = dir4 / "trainer";
  {
    std::ofstream out(unnamed);
    out << "print('run-path', __name__)\n";
  }
  auto run_path = start_commrun(dir4, {"--run-path", unnamed});
  CHECK(run_path->wait(30s) == 0);
  CHECK(read_file(dir4 / "stdout") == "[0]: run-path __main__\n");

  // --no-python executes it as it is (and here it cannot be).
  ScratchDir dir2;
  auto direct = start_commrun(dir2, {"--no-python", script});
  CHECK(direct->wait(30s) == 127);
  CHECK_THAT(read_file(dir2 / "stderr"), Catch::Contains("cannot run"));

  // -m runs a module.
  ScratchDir dir3;
  auto module = start_commrun(dir3, {"-m", "platform", "--terse"});
  CHECK(module->wait(30s) == 0);
  CHECK_THAT(read_file(dir3 / "stdout"), Catch::StartsWith("[0]: Linux"));
}

TEST_CASE("--pass-local-rank gives launch-style scripts their local rank",
          "[commrun]") {
  ScratchDir dir;
  const std::string script = dir / "launch_style.py";
  {
    std::ofstream out(script);
    // As scripts written for torch.distributed.launch read it.
    out << "import argparse\np = argparse.ArgumentParser()\n"
           "p.add_argument('--local_rank', '--local-rank', type=int, "
           "required=True)\np.add_argument('rest', nargs='*')\n"
           "a = p.parse_args()\nprint('local', a.local_rank, *a.rest)\n";
  }
  for (const std::string spelling : {"underscore", "dash"}) {
    INFO(spelling);
    auto commrun =
        start_commrun(dir, {"--nproc-per-node", "3", "--master-port", "0",
                            "--pass-local-rank", "--local-rank-spelling",
                            spelling, script, "x"});
    REQUIRE(commrun->wait(60s) == 0);
    auto lines = lines_of(read_file(dir / "stdout"));
    std::sort(lines.begin(), lines.end());
    CHECK(lines == std::vector<std::string>{"[0]: local 0 x", "[1]: local 1 x",
                                            "[2]: local 2 x"});
  }
  // Without the flag the script is refused by its own parser: nothing is
  // added to argv.
  auto plain = start_commrun(dir, {"--master-port", "0", script});
  CHECK(plain->wait(60s) == 2);
}

TEST_CASE("commrun takes torchrun's flags and sets torchrun's environment",
          "[commrun]") {
  const std::string show =
      "echo $RANK $ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME $GROUP_WORLD_SIZE "
      "$TORCHELASTIC_RUN_ID $TORCHELASTIC_RESTART_COUNT "
      "$TORCHELASTIC_MAX_RESTARTS $OMP_NUM_THREADS $MASTER_ADDR $MASTER_PORT "
      "$COMM_RDZV_TIMEOUT";
  {
    ScratchDir dir;
    auto commrun = start_commrun(
        dir, {"--nnodes=1:1", "--nproc_per_node=2", "--rdzv_id=100",
              "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29455",
              "--rdzv-conf", "join_timeout=77", "--max_restarts=3",
              "--monitor_interval=1", "--role", "trainer", "--local_addr",
              "127.0.0.9", "sh", "-c", show + " $COMM_TCP_ADDR"});
    REQUIRE(commrun->wait(30s) == 0);
    auto lines = lines_of(read_file(dir / "stdout"));
    std::sort(lines.begin(), lines.end());
    CHECK(lines ==
          std::vector<std::string>{
              "[0]: 0 0 2 trainer 1 100 0 3 1 127.0.0.1 29455 77 127.0.0.9",
              "[1]: 1 1 2 trainer 1 100 0 3 1 127.0.0.1 29455 77 127.0.0.9"});
    // torchrun's warning, once, when OMP_NUM_THREADS was unset.
    const std::string err = read_file(dir / "stderr");
    CHECK_THAT(err, Catch::Contains("OMP_NUM_THREADS"));
  }
  {
    // --standalone: loopback, a free port, a random run id; an
    // OMP_NUM_THREADS of the user's is kept, silently.
    ScratchDir dir;
    setenv("OMP_NUM_THREADS", "3", 1);
    auto commrun = [&] {
      // The default timeout, whatever the environment running the test.
      const EnvIs unset({{"COMM_RDZV_TIMEOUT", nullptr}});
      return start_commrun(
          dir, {"--standalone", "--nproc-per-node", "2", "sh", "-c", show});
    }();
    unsetenv("OMP_NUM_THREADS");
    REQUIRE(commrun->wait(30s) == 0);
    const auto lines = lines_of(read_file(dir / "stdout"));
    REQUIRE(lines.size() == 2);
    const std::regex form(
        R"(\[\d\]: \d \d 2 default 1 ([0-9a-f-]{8,}) 0 0 3 127\.0\.0\.1 (\d+) 900)");
    std::smatch first, second;
    REQUIRE(std::regex_match(lines[0], first, form));
    REQUIRE(std::regex_match(lines[1], second, form));
    CHECK(first[1] == second[1]);
    CHECK(first[2] == second[2]);
    CHECK(first[2] != "29500");
    CHECK_THAT(read_file(dir / "stderr"), !Catch::Contains("OMP_NUM_THREADS"));
  }
  for (const bool flag : {false, true}) {
    // A COMM_RDZV_TIMEOUT of the user's reaches the workers, unless
    // --rdzv-timeout says otherwise.
    INFO("--rdzv-timeout given: " << flag);
    ScratchDir dir;
    std::vector<std::string> args = {"--standalone", "--nproc-per-node", "1"};
    if (flag) args.insert(args.end(), {"--rdzv-timeout", "44"});
    args.insert(args.end(), {"sh", "-c", "echo $COMM_RDZV_TIMEOUT"});
    auto commrun = [&] {
      const EnvIs inherited({{"COMM_RDZV_TIMEOUT", "33"}});
      return start_commrun(dir, args);
    }();
    REQUIRE(commrun->wait(30s) == 0);
    CHECK(lines_of(read_file(dir / "stdout")) ==
          std::vector<std::string>{flag ? "[0]: 44" : "[0]: 33"});
  }
  {
    // auto: one worker per GPU, or per CPU without one.
    ScratchDir dir;
    auto commrun =
        start_commrun(dir, {"--nproc-per-node", "cpu", "--master-port", "0",
                            "sh", "-c", "echo $LOCAL_WORLD_SIZE"});
    REQUIRE(commrun->wait(60s) == 0);
    const auto lines = lines_of(read_file(dir / "stdout"));
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(lines.size() == static_cast<std::size_t>(cpus));
    CHECK(lines.at(0).substr(lines.at(0).find(' ') + 1) ==
          std::to_string(cpus));
    ScratchDir dir2;
    auto automatic = start_commrun(
        dir2, {"--nproc-per-node", "auto", "--master-port", "0", "true"});
    CHECK(automatic->wait(60s) == 0);
  }
}

// The one run directory commrun made in `base` (BASE/<run id>_XXXXXX), or
// empty when there is not exactly one.
std::string run_log_dir(const std::string& base, const std::string& run_id) {
  std::vector<std::string> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(base, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind(run_id + "_", 0) == 0 &&
        name.size() > run_id.size() + 1) {
      found.push_back(entry.path().string());
    }
  }
  return found.size() == 1 ? found.front() : std::string();
}

bool exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  auto lines = lines_of(text);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// commrun's stderr without its own lines ("commrun: ...").
std::vector<std::string> worker_errors(const ScratchDir& dir) {
  auto lines = sorted_lines(read_file(dir / "stderr"));
  std::erase_if(lines, [](const std::string& line) {
    return line.rfind("commrun: ", 0) == 0;
  });
  return lines;
}

const std::string kTwoStreams =
    "echo out$RANK; echo err$RANK >&2; echo more$RANK; printf last$RANK";

TEST_CASE("commrun --redirects sends each rank's streams to its own log files",
          "[commrun]") {
  ScratchDir dir;
  const std::string logs = dir / "logs";  // made by commrun, as torchrun does
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "2", "--master-port", "0", "--rdzv-id", "job7",
            "--log-dir", logs, "-r", "3", "sh", "-c", kTwoStreams});
  REQUIRE(commrun->wait(30s) == 0);
  const std::string run = run_log_dir(logs, "job7");
  REQUIRE_FALSE(run.empty());
  // Said once, where the files are.
  const std::string err = read_file(dir / "stderr");
  CHECK_THAT(err, Catch::Contains("log directory set to: " + run));
  for (int rank : {0, 1}) {
    const std::string at = run + "/attempt_0/" + std::to_string(rank) + "/";
    const std::string r = std::to_string(rank);
    CHECK(read_file(at + "stdout.log") ==
          "out" + r + "\nmore" + r + "\nlast" + r);
    CHECK(read_file(at + "stderr.log") == "err" + r + "\n");
  }
  CHECK(read_file(dir / "stdout").empty());
  CHECK(worker_errors(dir).empty());

  // 1: stdout only; stderr stays on the console with the rank prefix. The
  // underscore spelling, and a temporary directory when none is given.
  ScratchDir dir2;
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string saved_tmpdir = tmpdir != nullptr ? tmpdir : "";
  setenv("TMPDIR", dir2.path.str().c_str(), 1);
  auto out_only =
      start_commrun(dir2, {"--nproc_per_node=2", "--master-port", "0",
                           "--redirects", "1", "sh", "-c", kTwoStreams});
  if (tmpdir != nullptr) {
    setenv("TMPDIR", saved_tmpdir.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  REQUIRE(out_only->wait(30s) == 0);
  const std::regex said(R"(commrun: log directory set to: (\S+/none_\S+))");
  std::smatch match;
  const std::string err2 = read_file(dir2 / "stderr");
  REQUIRE(std::regex_search(err2, match, said));
  const std::string run2 = match[1].str();
  CHECK(run2.rfind(dir2.path.str() + "/torchelastic_", 0) == 0);
  CHECK(read_file(run2 + "/attempt_0/1/stdout.log") == "out1\nmore1\nlast1");
  CHECK_FALSE(exists(run2 + "/attempt_0/1/stderr.log"));
  CHECK(read_file(dir2 / "stdout").empty());
  CHECK(worker_errors(dir2) ==
        std::vector<std::string>{"[0]: err0", "[1]: err1"});

  // Each restart writes its own attempt_<restart>.
  ScratchDir dir3;
  auto restarted =
      start_commrun(dir3, {"--master-port", "0", "--max-restarts", "1",
                           "--log_dir", dir3 / "logs", "-r", "3", "sh", "-c",
                           "echo try$TORCHELASTIC_RESTART_COUNT; exit 3"});
  CHECK(restarted->wait(30s) == 3);
  const std::string run3 = run_log_dir(dir3 / "logs", "none");
  REQUIRE_FALSE(run3.empty());
  CHECK(read_file(run3 + "/attempt_0/0/stdout.log") == "try0\n");
  CHECK(read_file(run3 + "/attempt_1/0/stdout.log") == "try1\n");
}

TEST_CASE("commrun --tee writes the files and prefixed lines to the console",
          "[commrun]") {
  ScratchDir dir;
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "2", "--master-port", "0", "--role", "trainer",
            "--log-dir", dir / "logs", "-t", "3", "sh", "-c", kTwoStreams});
  REQUIRE(commrun->wait(30s) == 0);
  const std::string run = run_log_dir(dir / "logs", "none");
  REQUIRE_FALSE(run.empty());
  CHECK(sorted_lines(read_file(dir / "stdout")) ==
        std::vector<std::string>{"[trainer0]:last0", "[trainer0]:more0",
                                 "[trainer0]:out0", "[trainer1]:last1",
                                 "[trainer1]:more1", "[trainer1]:out1"});
  CHECK(worker_errors(dir) ==
        std::vector<std::string>{"[trainer0]:err0", "[trainer1]:err1"});
  for (int rank : {0, 1}) {
    const std::string at = run + "/attempt_0/" + std::to_string(rank) + "/";
    const std::string r = std::to_string(rank);
    CHECK(read_file(at + "stdout.log") ==
          "out" + r + "\nmore" + r + "\nlast" + r);
    CHECK(read_file(at + "stderr.log") == "err" + r + "\n");
  }

  // A rank that closes its output early stalls no one: rank 0 closes both
  // streams and keeps running while rank 1 writes 2000 lines.
  ScratchDir dir2;
  auto closing = start_commrun(
      dir2, {"--nproc-per-node", "2", "--master-port", "0", "--log-dir",
             dir2 / "logs", "-t", "1", "sh", "-c",
             "if [ $RANK = 0 ]; then echo bye; exec >&- 2>&-; sleep 1; "
             "else i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); "
             "done; fi"});
  REQUIRE(closing->wait(60s) == 0);
  const std::string run2 = run_log_dir(dir2 / "logs", "none");
  REQUIRE_FALSE(run2.empty());
  CHECK(read_file(run2 + "/attempt_0/0/stdout.log") == "bye\n");
  const auto lines = lines_of(read_file(run2 + "/attempt_0/1/stdout.log"));
  REQUIRE(lines.size() == 2000);
  CHECK(lines.back() == "line1999");
  CHECK(lines_of(read_file(dir2 / "stdout")).size() == 2001);
}

TEST_CASE("commrun --redirects and --tee take torchrun's per-rank map",
          "[commrun]") {
  ScratchDir dir;
  // Rank 0: stdout to its file; rank 1: stderr to its file and stdout to
  // file and console; rank 2, left out: everything on the console.
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "3", "--master-port", "0", "--log-dir",
            dir / "logs", "-r", "0:1,1:2", "-t", "1:1", "sh", "-c",
            "echo out$RANK; echo err$RANK >&2"});
  REQUIRE(commrun->wait(30s) == 0);
  const std::string run = run_log_dir(dir / "logs", "none");
  REQUIRE_FALSE(run.empty());
  CHECK(read_file(run + "/attempt_0/0/stdout.log") == "out0\n");
  CHECK_FALSE(exists(run + "/attempt_0/0/stderr.log"));
  CHECK(read_file(run + "/attempt_0/1/stdout.log") == "out1\n");
  CHECK(read_file(run + "/attempt_0/1/stderr.log") == "err1\n");
  CHECK(exists(run + "/attempt_0/2"));
  CHECK_FALSE(exists(run + "/attempt_0/2/stdout.log"));
  CHECK_FALSE(exists(run + "/attempt_0/2/stderr.log"));
  CHECK(sorted_lines(read_file(dir / "stdout")) ==
        std::vector<std::string>{"[2]: out2", "[default1]:out1"});
  CHECK(worker_errors(dir) ==
        std::vector<std::string>{"[0]: err0", "[2]: err2"});
}

TEST_CASE("bad --redirects and --tee values are refused with the reason",
          "[commrun]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"-r", "4", "true"}, "--redirects 4: give 0 (none)"},
      {{"--redirects", "stdout", "true"}, "--redirects stdout: give 0"},
      {{"-t", "0:5", "true"}, "--tee 0:5: give 0"},
      {{"--tee", "0:1,", "true"}, "--tee 0:1,: give 0"},
      {{"--nproc-per-node", "2", "-r", "2:1", "true"},
       "--redirects 2:1: local rank 2 is not below --nproc-per-node 2"},
      {{"--nproc-per-node", "2", "-t", "0:1,0:2", "true"},
       "--tee 0:1,0:2: local rank 0 is given twice"},
  };
  for (const auto& [args, message] : bad) {
    ScratchDir dir;
    INFO(message);
    auto commrun = start_commrun(dir, args);
    CHECK(commrun->wait(10s) == 2);
    CHECK_THAT(read_file(dir / "stderr"), Catch::Contains(message));
  }
  // A log directory that cannot be made is named.
  ScratchDir dir;
  const std::string file = dir / "file";
  std::ofstream(file) << "x";
  auto commrun =
      start_commrun(dir, {"--log-dir", file + "/logs", "-r", "3", "true"});
  CHECK(commrun->wait(10s) == 1);
  CHECK_THAT(read_file(dir / "stderr"),
             Catch::Contains("--log-dir " + file + "/logs"));
}

TEST_CASE("a rank killed or stopped mid-output keeps its lines in its file",
          "[commrun]") {
  for (const std::string mode : {"-r", "-t"}) {
    INFO(mode);
    ScratchDir dir;
    // Rank 1 writes, waits for rank 0 to have written, and is killed
    // before it can write more; rank 0 is then stopped by commrun.
    const std::string ready = dir / "ready";
    auto commrun = start_commrun(
        dir, {"--nproc-per-node", "2", "--master-port", "0", "--log-dir",
              dir / "logs", mode, "3", "sh", "-c",
              "echo before$RANK; printf partial$RANK; echo oops$RANK >&2; "
              "if [ $RANK = 1 ]; then i=0; while [ $i -lt 500 ] && ! [ -e " +
                  ready +
                  " ]; do sleep 0.02; i=$((i+1)); done; kill -9 $$; "
                  "fi; touch " +
                  ready + "; exec sleep 60"});
    CHECK(commrun->wait(30s) == 128 + SIGKILL);
    const std::string run = run_log_dir(dir / "logs", "none");
    REQUIRE_FALSE(run.empty());
    for (int rank : {0, 1}) {
      const std::string at = run + "/attempt_0/" + std::to_string(rank) + "/";
      const std::string r = std::to_string(rank);
      CHECK(read_file(at + "stdout.log") == "before" + r + "\npartial" + r);
      CHECK(read_file(at + "stderr.log") == "oops" + r + "\n");
    }
  }
  // commrun itself signalled while the workers' output waits in its pipes:
  // all of it reaches the files and the console.
  ScratchDir dir;
  const std::string lots =
      "i=0; while [ $i -lt 500 ]; do echo line$RANK.$i; i=$((i+1)); done; " +
      sleeper(dir);
  auto commrun = start_commrun(
      dir, {"--nproc-per-node", "2", "--master-port", "0", "--log-dir",
            dir / "logs", "-t", "3", "sh", "-c", lots});
  wait_for_pids(dir, 2);
  commrun->kill(SIGTERM);
  CHECK(commrun->wait(20s) == 128 + SIGTERM);
  const std::string run = run_log_dir(dir / "logs", "none");
  REQUIRE_FALSE(run.empty());
  for (int rank : {0, 1}) {
    const auto lines = lines_of(
        read_file(run + "/attempt_0/" + std::to_string(rank) + "/stdout.log"));
    REQUIRE(lines.size() == 500);
    CHECK(lines.back() == "line" + std::to_string(rank) + ".499");
  }
  CHECK(lines_of(read_file(dir / "stdout")).size() == 1000);
}

TEST_CASE("a libcomm job runs under commrun", "[commrun]") {
  ScratchDir dir;
  auto commrun =
      start_commrun(dir, {"--nproc-per-node", "3", "--master-port", "0",
                          from_env("ALL_REDUCE_PERF_BIN"), "-b", "1K", "-e",
                          "64K", "-f", "8", "-n", "3", "-w", "1"});
  REQUIRE(commrun->wait(120s) == 0);
  const std::string out = read_file(dir / "stdout");
  INFO(out);
  CHECK_THAT(out, Catch::Contains("[0]: # libcomm") &&
                      Catch::Contains("all_reduce_perf: 3 ranks") &&
                      Catch::Contains("[0]: # Out of bounds values : 0 OK"));
}

TEST_CASE(
    "the example trainer under commrun resumes from its checkpoint, its "
    "epochs numbered on",
    "[commrun][ddp]") {
  ScratchDir dir;
  const std::string first = dir / "first.safetensors";
  const std::string second = dir / "second.safetensors";
  // Rank 0 prints "[0]: epoch E: loss ..." for each epoch it trains.
  auto epochs_printed = [](const std::string& out) {
    std::vector<int> epochs;
    const std::regex row(R"(\[0\]: epoch (\d+): loss )");
    for (const std::string& line : lines_of(out)) {
      std::smatch match;
      if (std::regex_search(line, match, row)) {
        epochs.push_back(std::stoi(match[1].str()));
      }
    }
    return epochs;
  };
  const std::vector<std::vector<std::string>> runs = {
      {"--epochs", "2", "--checkpoint", first},
      {"--epochs", "2", "--resume", first, "--checkpoint", second},
      {"--epochs", "1", "--resume", second}};
  const std::vector<std::vector<int>> expected = {{0, 1}, {2, 3}, {4}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    INFO("run " << i);
    ScratchDir out;
    std::vector<std::string> args = {"--nproc-per-node",
                                     "2",
                                     "--master-port",
                                     "0",
                                     from_env("DDP_TRAINER_BIN"),
                                     "--dataset",
                                     "512"};
    args.insert(args.end(), runs[i].begin(), runs[i].end());
    auto commrun = start_commrun(out, args);
    REQUIRE(commrun->wait(120s) == 0);
    CHECK(epochs_printed(read_file(out / "stdout")) == expected[i]);
  }
}

// The CPUs each rank of an all_reduce_perf -np run reported in its header
// ("#  Rank  1 Pid 123 on host device cpu cpus 0-1"), by rank.
std::vector<std::string> bench_rank_cpus(const std::string& bind, int ranks) {
  ScratchDir dir;
  auto bench = start_program(dir, from_env("ALL_REDUCE_PERF_BIN"),
                             {"-np", std::to_string(ranks), "-b", "1K", "-e",
                              "1K", "-n", "2", "-w", "0", "--bind-to", bind});
  REQUIRE(bench->wait(120s) == 0);
  const std::regex row(R"(#  Rank +(\d+) Pid .* cpus (\S+))");
  std::vector<std::string> cpus(static_cast<std::size_t>(ranks));
  for (const std::string& line : lines_of(read_file(dir / "stdout"))) {
    std::smatch match;
    if (std::regex_search(line, match, row)) {
      cpus.at(std::stoul(match[1].str())) = match[2].str();
    }
  }
  return cpus;
}

TEST_CASE("all_reduce_perf -np places its ranks as --bind-to asks", "[bench]") {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  REQUIRE(sched_getaffinity(0, sizeof(usable), &usable) == 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &usable)) cpus.push_back(cpu);
  }
  const int count = static_cast<int>(cpus.size());

  SECTION("core: rank r on the r-th usable CPU, wrapping around") {
    const auto placed = bench_rank_cpus("core", 3);
    for (int r = 0; r < 3; ++r) {
      CHECK(placed[r] == std::to_string(cpus[r % count]));
    }
  }
  SECTION("none: every rank may use every CPU") {
    const auto placed = bench_rank_cpus("none", 2);
    CHECK(placed[0] == placed[1]);
    CHECK_FALSE(placed[0].empty());
    if (count > 1) {
      CHECK(placed[0].find_first_of("-,") != std::string::npos);
    }
  }
  SECTION("auto: bound when the ranks fit the CPUs, as mpirun") {
    const auto fitting = bench_rank_cpus("auto", count);
    for (int r = 0; r < count; ++r) {
      CHECK(fitting[r] == std::to_string(cpus[r]));
    }
    const auto crowded = bench_rank_cpus("auto", count + 1);
    CHECK(crowded[0] == bench_rank_cpus("none", 1)[0]);
  }
}

TEST_CASE("all_reduce_perf -np refuses a malformed knob of its rendezvous",
          "[bench]") {
  // Its ranks make their own rendezvous, which does not use the knob: a
  // bad value must still be an error, not go unnoticed.
  ScratchDir dir;
  const EnvIs bad({{"COMM_RDZV_TIMEOUT", "5s"}});
  auto bench = start_program(dir, from_env("ALL_REDUCE_PERF_BIN"),
                             {"-np", "2", "-b", "1K", "-e", "1K", "-n", "1"});
  CHECK(bench->wait(60s) == 2);
  const std::string err = read_file(dir / "stderr");
  INFO(err);
  CHECK_THAT(err, Catch::Contains("all_reduce_perf: COMM_RDZV_TIMEOUT='5s' "
                                  "is not an integer"));
}

TEST_CASE("a rank waiting for its rendezvous says for whom as it waits",
          "[bench]") {
  // Rank 0 of two, alone: it reports the missing rank every tenth of its
  // 3 s (at least a second), then fails naming it.
  ScratchDir dir;
  const EnvIs env({{"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "0"},
                   {"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"COMM_RDZV_TIMEOUT", "3"}});
  auto bench = start_program(dir, from_env("ALL_REDUCE_PERF_BIN"),
                             {"-b", "1K", "-e", "1K", "-n", "1"});
  CHECK(bench->wait(60s) == 1);
  const std::string err = read_file(dir / "stderr");
  INFO(err);
  CHECK_THAT(err,
             Catch::Contains("rendezvous: rank 0 has waited 1000 ms of its "
                             "3000 ms: 1 of 2 ranks arrived; missing rank 1") &&
                 Catch::Contains("rendezvous timed out after 3000 ms: 1 of 2 "
                                 "ranks arrived; missing rank 1"));
}

TEST_CASE("all_reduce_perf -np kills a rank left stopped after another failed",
          "[bench]") {
  ScratchDir dir;
  // A long run whose operations time out after 2 s: once rank 1 is stopped,
  // rank 0's all_reduce fails, and the SIGTERM that follows stays pending
  // on the stopped rank 1.
  auto bench =
      start_program(dir, from_env("ALL_REDUCE_PERF_BIN"),
                    {"-np", "2", "-b", "1K", "-e", "1K", "-n", "10000000", "-w",
                     "0", "--timeout", "2", "--bind-to", "none"});
  // Rank 1's pid, from the header that rank 0 prints before it times
  // anything.
  const std::regex row(R"(#  Rank +1 Pid +(\d+) )");
  pid_t rank1 = -1;
  for (int round = 0; round < 3000 && rank1 < 0; ++round) {  // at most 30 s
    std::smatch match;
    const std::string out = read_file(dir / "stdout");
    if (std::regex_search(out, match, row)) {
      rank1 = std::stoi(match[1].str());
    } else {
      std::this_thread::sleep_for(10ms);
    }
  }
  REQUIRE(rank1 > 0);
  REQUIRE(kill(rank1, SIGSTOP) == 0);
  // Rank 0 fails 2 s later; rank 1 is killed 5 s after that
  // (comm::bench::kRankExitGrace).
  CHECK(bench->wait(60s) == 1);
  CHECK_FALSE(alive(rank1));
  const std::string err = read_file(dir / "stderr");
  INFO(err);
  CHECK_THAT(err, Catch::Contains("all_reduce_perf: rank 1 had not ended "
                                  "5.0 s after rank 0 failed; killed it "
                                  "(SIGKILL)"));
}
