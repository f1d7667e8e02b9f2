// The *_perf harness: its command line, nccl-tests' bandwidth formulas, the
// result check (on correct results and on a deliberately corrupted one), the
// JSON file, and how -np waits for its rank processes.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/harness/collective.h"
#include "bench/harness/launch.h"
#include "bench/harness/options.h"
#include "bench/harness/runner.h"
#include "libcomm/error.h"
#include "support/capture_stderr.h"
#include "support/env_is.h"
#include "support/temp_path.h"
#include "support/thread_ranks.h"

using comm::DType;
using comm::ReduceOp;
using comm::bench::Options;
using comm::bench::parse_options;
using comm::bench::UsageError;
using comm::testing::EnvIs;

namespace {

Options parse(std::vector<std::string> args) {
  return parse_options("all_reduce_perf", args);
}

// Runs `collective` with `options` over `world` thread ranks; returns each
// rank's report (and fails the test on a rank's error).
std::vector<comm::bench::Report> run_threads(
    const comm::bench::Collective& collective, const Options& options,
    int world) {
  std::vector<comm::bench::Report> reports(static_cast<std::size_t>(world));
  auto errors = comm::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    reports[static_cast<std::size_t>(g.rank())] = comm::bench::run_benchmark(
        collective, options, g, comm::Device::cpu(), nullptr);
  });
  for (const auto& e : errors) REQUIRE(e.empty());
  return reports;
}

// all_reduce, with rank 1's result corrupted (one element) after each run,
// as a broken backend would leave it.
class CorruptedAllReduce final : public comm::bench::Collective {
 public:
  const Collective& real = comm::bench::find_collective("all_reduce");
  const char* name() const override { return "all_reduce"; }
  bool uses_op() const override { return true; }
  double bus_factor(int world) const override { return real.bus_factor(world); }
  void prepare(comm::bench::Case& c) const override { real.prepare(c); }
  void start(comm::ProcessGroup& group, comm::bench::Case& c,
             std::vector<std::shared_ptr<comm::Work>>& started) const override {
    const std::size_t first = started.size();
    real.start(group, c, started);
    for (std::size_t i = first; i < started.size(); ++i) started[i]->wait();
    if (c.rank == 1 && c.count > 0) {
      comm::bench::fill(c.outputs[0], [&](std::size_t i) {
        const double good = real.expected(c, i);
        return i == 0 ? good + 1 : good;
      });
    }
  }
  double expected(const comm::bench::Case& c, std::size_t i) const override {
    return real.expected(c, i);
  }
};

}  // namespace

TEST_CASE("the command line takes nccl-tests' flags", "[bench]") {
  const Options o = parse(
      {"-b",        "1K",  "-e",  "64M", "-f",        "4",    "-n", "7",
       "-w",        "0",   "-c",  "0",   "-d",        "half", "-o", "max",
       "-r",        "all", "-a",  "2",   "-z",        "1",    "-J", "x.json",
       "--backend", "tcp", "-np", "3",   "--bind-to", "none"});
  CHECK(o.min_bytes == 1024);
  CHECK(o.max_bytes == 64 << 20);
  CHECK(o.step_factor == 4);
  CHECK(o.iterations == 7);
  CHECK(o.warmup == 0);
  CHECK(o.check == 0);
  CHECK(o.dtypes == std::vector<DType>{DType::kF16});
  CHECK(o.ops == std::vector<ReduceOp>{ReduceOp::kMax});
  CHECK(o.all_roots);
  CHECK(o.average == comm::bench::Average::kMin);
  CHECK(o.blocking);
  CHECK(o.json_path == "x.json");
  CHECK(o.spawn == 3);
  CHECK(o.binding == Options::Binding::kNone);
  CHECK(o.device == "cpu");
  CHECK(o.sizes() == std::vector<std::int64_t>{1 << 10, 1 << 12, 1 << 14,
                                               1 << 16, 1 << 18, 1 << 20,
                                               1 << 22, 1 << 24, 1 << 26});

  // --iteration-bytes counts per size as the peers do: 64M / size, 3 to
  // -n; without it every size runs -n.
  const Options peers = parse({"-n", "200", "--iteration-bytes", "64M"});
  CHECK(peers.iterations_for(1 << 10) == 200);
  CHECK(peers.iterations_for(1 << 18) == 200);
  CHECK(peers.iterations_for(1 << 20) == 64);
  CHECK(peers.iterations_for(1 << 24) == 4);
  CHECK(peers.iterations_for(64 << 20) == 3);
  CHECK(parse({"-n", "2", "--iteration-bytes", "1K"}).iterations_for(4096) ==
        2);
  CHECK(o.iterations_for(64 << 20) == 7);
  CHECK_THROWS_AS(parse({"--iteration-bytes", "lots"}), UsageError);

  // nccl-tests' defaults: 32M only, 20 iterations, 5 warm-up, checked.
  const Options d = parse({});
  CHECK(d.sizes() == std::vector<std::int64_t>{32 << 20});
  CHECK(d.iterations == 20);
  CHECK(d.warmup == 5);
  CHECK(d.check == 1);
  CHECK(d.binding == Options::Binding::kCore);
  CHECK(parse({"--bind-to", "auto"}).binding == Options::Binding::kAuto);
  CHECK(d.average == comm::bench::Average::kMean);
  CHECK(parse({"-b", "1M", "-e", "3M"}).sizes() ==
        std::vector<std::int64_t>{1 << 20, 2 << 20, 3 << 20});
  CHECK(parse({"-b", "8", "-e", "20", "-i", "4"}).sizes() ==
        std::vector<std::int64_t>{8, 12, 16, 20});
  CHECK(parse({"-d", "all"}).dtypes.size() == 8);
  CHECK(parse({"-o", "all"}).ops.size() == 5);
  CHECK(parse({"--backend", "nccl"}).device == "cuda");
  CHECK_FALSE(d.fresh_inputs);
  CHECK(parse({"-z", "1", "--fresh-inputs"}).fresh_inputs);
  CHECK_FALSE(d.shared_host);
  CHECK(parse({"-R", "1"}).shared_host);
  // An option given twice takes its last value, as in nccl-tests.
  CHECK(parse({"-n", "3", "-n", "5"}).iterations == 5);
}

TEST_CASE("bad flags are usage errors naming the flag", "[bench]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"-b", "1X"}, "-b"},
      {{"-b", "-5"}, "-b"},
      {{"-e", "two"}, "-e"},
      {{"-b", "2K", "-e", "1K"}, "-b 2K is larger than -e 1K"},
      // The default that the user did not type is called one.
      {{"-e", "4K"}, "-b 32M (the default) is larger than -e 4K; give -b too"},
      // Extra words, in the order typed.
      {{"-g", "2"}, "unexpected arguments: -g 2"},
      {{"-f", "1"}, "-f"},
      {{"-i", "0"}, "-i"},
      {{"-b", "1", "-e", "1G", "-i", "1"}, "more than 10000 sizes"},
      {{"-n", "0"}, "-n"},
      {{"-w", "x"}, "-w"},
      {{"-c", "-1"}, "-c takes an integer from 0"},
      {{"-w", "-1"}, "-w takes an integer from 0"},
      {{"-n", "5K"}, "-n takes an integer from 1"},
      {{"-d", "complex"}, "-d"},
      {{"-o", "median"}, "-o"},
      {{"-r", "-1"}, "-r takes an integer from 0"},
      {{"-a", "4"}, "-a"},
      {{"-z", "2"}, "-z"},
      {{"-np", "0"}, "-np"},
      {{"-np", "-1"}, "-np takes an integer from 1"},
      {{"--device", "tpu"}, "--device"},
      {{"--bind-to", "socket"}, "--bind-to"},
      {{"--frobnicate"}, "frobnicate"},
      {{"-b", "2T"}, "-b"},
      {{"--fresh-inputs"}, "needs -z 1"},
      {{"-z", "1", "--fresh-inputs", "--device", "cuda"}, "--device cuda"},
      {{"-R", "2"}, "-R"},
      {{"-R", "1", "--device", "cuda"}, "--device cuda"},
  };
  for (const auto& [args, named] : bad) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    INFO(joined);
    try {
      parse(args);
      FAIL("accepted");
    } catch (const UsageError& e) {
      CHECK_THAT(e.what(), Catch::Contains(named));
    }
  }
  CHECK_THROWS_AS(parse({"--help"}), comm::bench::HelpRequested);
}

namespace {

// Unsets the variables by which a launcher places a rank, for the length
// of a test.
EnvIs launcher_env_cleared() {
  EnvIs::Values values;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS"}) {
    values.emplace_back(name, nullptr);
  }
  return EnvIs(values);
}

// What detect_placement throws as InvalidArgument, or "no error".
std::string placement_error(const Options& options) {
  try {
    comm::bench::detect_placement(options);
  } catch (const comm::InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("a half-set launcher environment is an error, not one rank alone",
          "[bench][launch]") {
  const auto cleared = launcher_env_cleared();
  const Options options;
  setenv("WORLD_SIZE", "2", 1);
  CHECK_THAT(placement_error(options),
             Catch::Contains("WORLD_SIZE is set but RANK is not"));
  unsetenv("WORLD_SIZE");
  setenv("RANK", "1", 1);
  CHECK_THAT(placement_error(options),
             Catch::Contains("RANK is set but WORLD_SIZE is not"));
  setenv("WORLD_SIZE", "two", 1);
  CHECK_THAT(
      placement_error(options),
      Catch::Contains("WORLD_SIZE is 'two', not a non-negative integer"));
  setenv("WORLD_SIZE", "2", 1);
  comm::bench::Placement placement;
  REQUIRE_NOTHROW(placement = comm::bench::detect_placement(options));
  CHECK(placement.launcher == "env");
  CHECK(placement.rank == 1);
  CHECK(placement.world == 2);
  // -np starts its own ranks, which a stray variable does not disturb.
  unsetenv("WORLD_SIZE");
  Options spawning;
  spawning.spawn = 2;
  REQUIRE_NOTHROW(placement = comm::bench::detect_placement(spawning));
  CHECK(placement.launcher == "spawn");
  unsetenv("RANK");
  REQUIRE_NOTHROW(placement = comm::bench::detect_placement(options));
  CHECK(placement.launcher == "single");
}

TEST_CASE("a bad launcher environment ends the program with status 2",
          "[bench][launch]") {
  const auto cleared = launcher_env_cleared();
  setenv("WORLD_SIZE", "2", 1);
  char program[] = "all_reduce_perf";
  char* argv[] = {program, nullptr};
  int status = -1;
  const std::string said = comm::testing::capture_stderr([&] {
    status = comm::bench::bench_main(comm::bench::find_collective("all_reduce"),
                                     1, argv);
  });
  CHECK(status == 2);
  CHECK_THAT(said, Catch::Contains("all_reduce_perf: WORLD_SIZE is set but "
                                   "RANK is not") &&
                       !Catch::Contains("--help"));
}

TEST_CASE("--print-config prints the knobs and nothing else", "[bench]") {
  try {
    parse({"--print-config"});
    FAIL("--print-config ran the benchmark");
  } catch (const comm::bench::HelpRequested& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("COMM_") &&
                             Catch::Contains("\nCOMM_TCP_SPIN_US = ") &&
                             Catch::Contains("\nCOMM_STORE_TOKEN = "));
  }
}

TEST_CASE("bandwidths follow nccl-tests' formulas", "[bench]") {
  using comm::bench::find_collective;
  // 1 GB in one second at 4 ranks: algbw 1 GB/s; busbw by the collective.
  const std::vector<std::pair<std::string, double>> factors = {
      {"all_reduce", 2.0 * 3 / 4},
      {"reduce_scatter", 3.0 / 4},
      {"all_gather", 3.0 / 4},
      {"gather", 3.0 / 4},
      {"scatter", 3.0 / 4},
      {"alltoall", 3.0 / 4},
      {"broadcast", 1.0},
      {"reduce", 1.0},
      {"sendrecv", 1.0}};
  for (const auto& [name, factor] : factors) {
    INFO(name);
    const auto [algbw, busbw] =
        comm::bench::bandwidths(find_collective(name), 1'000'000'000, 1.0, 4);
    CHECK(algbw == Approx(1.0));
    CHECK(busbw == Approx(factor));
  }
  CHECK(comm::bench::bandwidths(find_collective("all_reduce"), 4096, 2e-6, 2)
            .first == Approx(2.048));
  // Sizes: per rank for all_reduce, the whole buffer of world blocks for
  // all_gather (rounded down to whole blocks).
  const auto& all_reduce = find_collective("all_reduce");
  const auto& all_gather = find_collective("all_gather");
  CHECK(all_reduce.count_for(1024, DType::kF32, 4) == 256);
  CHECK(all_reduce.bytes_for(256, DType::kF32, 4) == 1024);
  CHECK(all_gather.count_for(1000, DType::kF32, 3) == 83);
  CHECK(all_gather.bytes_for(83, DType::kF32, 3) == 996);
  CHECK_THROWS_AS(find_collective("allreduce"), comm::InvalidArgument);
}

TEST_CASE("every collective's check passes on correct results",
          "[bench][check]") {
  Options options = parse({"-b", "0", "-e", "3000", "-i", "1000", "-n", "2",
                           "-w", "1", "-c", "1", "-r", "all", "-d", "all"});
  for (const auto& name : comm::bench::collective_names()) {
    const auto& collective = comm::bench::find_collective(name);
    for (int world : {1, 2, 3}) {
      Options o = options;
      if (collective.uses_op()) o.ops = parse({"-o", "all"}).ops;
      INFO(name << " at world " << world);
      const auto reports = run_threads(collective, o, world);
      for (const auto& report : reports) {
        CHECK(report.wrong == 0);
        // Every row was checked, out of place and (where it exists) in place.
        for (const auto& row : report.rows) {
          CHECK(row.out_of_place.wrong == 0);
          CHECK(row.in_place.has_value() == collective.has_in_place());
        }
      }
      CHECK(reports[0].peak_rss_bytes.size() ==
            static_cast<std::size_t>(world));
    }
  }
}

TEST_CASE("-c 1 catches a corrupted result", "[bench][check]") {
  const CorruptedAllReduce corrupted;
  Options options = parse(
      {"-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "-c", "1"});
  const auto reports = run_threads(corrupted, options, 2);
  for (const auto& report : reports) {
    // One wrong element on rank 1, out of place and in place, at each of
    // the two sizes; every rank sees the sum.
    CHECK(report.wrong == 4);
    REQUIRE(report.rows.size() == 2);
    for (const auto& row : report.rows) {
      CHECK(row.out_of_place.wrong == 1);
      CHECK(row.in_place->wrong == 1);
    }
  }
  // -c 0: nothing is checked, so nothing is counted.
  options.check = 0;
  for (const auto& report : run_threads(corrupted, options, 2)) {
    CHECK(report.wrong == 0);
    CHECK(report.rows[0].out_of_place.wrong == -1);
  }
}

TEST_CASE(
    "-J's path is checked before the sweep, and nothing is left of the "
    "check",
    "[bench][json]") {
  using comm::bench::check_output_path;
  auto refused = [](const std::string& path) -> std::string {
    try {
      check_output_path("-J", path);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "accepted";
  };
  comm::testing::TempPath dir("bench_json_dir");
  REQUIRE(mkdir(dir.str().c_str(), 0700) == 0);
  CHECK_THAT(refused(dir.str() + "/missing/x.json"),
             Catch::StartsWith("-J " + dir.str() + "/missing/x.json: ") &&
                 Catch::Contains("No such file"));
  CHECK_THAT(refused(dir.str()), Catch::Contains("is a directory"));
  // A file that was not there is made and removed again.
  const std::string fresh = dir.str() + "/fresh.json";
  CHECK(refused(fresh) == "accepted");
  CHECK(access(fresh.c_str(), F_OK) != 0);
  // One that was there keeps what it held.
  const std::string kept = dir.str() + "/kept.json";
  std::ofstream(kept) << "earlier";
  CHECK(refused(kept) == "accepted");
  std::ifstream in(kept);
  std::string held;
  in >> held;
  CHECK(held == "earlier");
  // A pipe is left to the writer: opening it would wait for a reader.
  const std::string pipe = dir.str() + "/pipe";
  REQUIRE(mkfifo(pipe.c_str(), 0600) == 0);
  CHECK(refused(pipe) == "accepted");
  for (const std::string& name : {kept, pipe}) unlink(name.c_str());
  rmdir(dir.str().c_str());
}

TEST_CASE("-J writes JSON that a JSON parser reads back", "[bench][json]") {
  comm::testing::TempPath path("bench_json");
  const auto& collective = comm::bench::find_collective("sendrecv");
  Options options =
      parse({"-b", "1K", "-e", "4K", "-f", "2", "-n", "2", "-J", path.str()});
  const auto reports = run_threads(collective, options, 2);
  comm::bench::write_json(path.str(), "sendrecv_perf", collective, options, 2,
                          reports[0]);
  // Python's json module is the independent reader (meson needs python3).
  const std::string script =
      "import json,sys; d=json.load(open(sys.argv[1])); "
      "assert d['benchmark']=='sendrecv_perf' and d['world_size']==2; "
      "assert [r['size_bytes'] for r in d['results']]==[1024,2048,4096]; "
      "assert all(r['in_place'] is None and r['out_of_place']['wrong']==0 "
      "for r in d['results']); assert len(d['peak_rss_bytes'])==2";
  CHECK(std::system(("python3 -c \"" + script + "\" " + path.str()).c_str()) ==
        0);
}

namespace {

// Forks a process that stands for a rank: it runs `body` and exits with its
// value, and dies with the test process, so that none outlives a failed
// test.
pid_t fork_rank(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    _exit(body());
  }
  return pid;
}

// What comm::bench::wait_for_ranks said on its log.
std::string read_log(std::FILE* log) {
  std::rewind(log);
  std::string text;
  char chunk[512];
  while (std::fgets(chunk, sizeof(chunk), log) != nullptr) text += chunk;
  return text;
}

}  // namespace

TEST_CASE(
    "-np: ranks that have not ended some time after one failed are killed "
    "and named",
    "[bench][launch]") {
  using namespace std::chrono_literals;
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  std::vector<pid_t> ranks(4);
  // Rank 1 is stopped (SIGSTOP), rank 2 ignores SIGTERM, rank 3 ends on it;
  // each waits at most a minute. Rank 0 then fails.
  ranks[1] = fork_rank([] {
    raise(SIGSTOP);
    return 0;
  });
  int status = 0;
  REQUIRE(waitpid(ranks[1], &status, WUNTRACED) == ranks[1]);
  REQUIRE(WIFSTOPPED(status));
  for (int rank : {2, 3}) {
    ranks[rank] = fork_rank([&, rank] {
      // Rank 3 ends on SIGTERM as a rank process does, not through the
      // handler Catch installed in this test process, which
      // ThreadSanitizer would only run once the child leaves sleep().
      signal(SIGTERM, rank == 2 ? SIG_IGN : SIG_DFL);
      (void)!write(ready[1], "x", 1);
      sleep(60);
      return 0;
    });
  }
  char byte;
  for (int i = 0; i < 2; ++i) REQUIRE(read(ready[0], &byte, 1) == 1);
  close(ready[0]);
  close(ready[1]);
  ranks[0] = fork_rank([] { return 1; });

  std::FILE* log = std::tmpfile();
  REQUIRE(log != nullptr);
  const auto start = std::chrono::steady_clock::now();
  CHECK(comm::bench::wait_for_ranks(ranks, "all_reduce_perf", 500ms, log) == 1);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 500ms);
  CHECK(took < 5s);
  const std::string said = read_log(log);
  std::fclose(log);
  INFO(said);
  CHECK_THAT(said, Catch::Contains("all_reduce_perf: rank 1 had not ended "
                                   "0.5 s after rank 0 failed; killed it "
                                   "(SIGKILL)\n") &&
                       Catch::Contains("all_reduce_perf: rank 2 had not "
                                       "ended 0.5 s after rank 0 failed"));
  CHECK_THAT(said, !Catch::Contains("rank 3"));
  // Every rank was reaped.
  for (pid_t pid : ranks) {
    errno = 0;
    CHECK(waitpid(pid, nullptr, WNOHANG) == -1);
    CHECK(errno == ECHILD);
  }
}

TEST_CASE("-np: ranks that all succeed are waited for, and nothing is said",
          "[bench][launch]") {
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.push_back(fork_rank([rank] {
      usleep(static_cast<useconds_t>(rank) * 20000);
      return 0;
    }));
  }
  std::FILE* log = std::tmpfile();
  REQUIRE(log != nullptr);
  CHECK(comm::bench::wait_for_ranks(ranks, "all_reduce_perf",
                                    std::chrono::milliseconds(500), log) == 0);
  CHECK(read_log(log).empty());
  std::fclose(log);
}

TEST_CASE("-np: a rank that a signal ended first is named with the signal",
          "[bench][launch]") {
  std::vector<pid_t> ranks;
  ranks.push_back(fork_rank([] { return 0; }));
  ranks.push_back(fork_rank([] {
    raise(SIGKILL);
    return 0;
  }));
  std::FILE* log = std::tmpfile();
  REQUIRE(log != nullptr);
  CHECK(comm::bench::wait_for_ranks(ranks, "all_reduce_perf",
                                    std::chrono::milliseconds(500), log) == 1);
  CHECK_THAT(read_log(log),
             Catch::Contains("all_reduce_perf: rank 1 was killed by signal " +
                             std::to_string(SIGKILL)));
  std::fclose(log);
}
