// store_perf: TCPStore throughput and latency under concurrent clients, the
// time of a large rendezvous, and the server's CPU use with idle clients.
//
//   store_perf [--clients C] [--ops N] [--value-bytes B] [--processes]
//              [--rendezvous W] [--idle K] [--idle-seconds S]
//
// The workload runs in phases (set, get, add, wait): in each, every client
// issues N calls of that kind on keys of its own, and the phase's rate is
// C * N divided by its wall time; p50 and p99 are per call. Clients are
// threads, or with --processes forked processes (as the torch script beside
// this file uses, so that the two compare like for like). The server runs
// inside this process, as rank 0's does.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "libcomm/distributed/rendezvous.h"
#include "libcomm/error.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kPhases[] = {"set", "get", "add", "wait"};
constexpr int kPhaseCount = 4;

struct Config {
  int clients = 64;
  int ops = 2000;
  int value_bytes = 64;
  bool processes = false;
  int rendezvous_world = 0;
  int idle_connections = 0;
  double idle_seconds = 5.0;
};

comm::TCPStoreOptions client_options(std::uint16_t port) {
  comm::TCPStoreOptions options;
  options.port = port;
  options.timeout = 120s;
  return options;
}

// One client's run: for each phase, wait at the store's phase barrier, then
// time every call. Returns per-phase latencies in microseconds.
std::vector<std::vector<float>> run_client(std::uint16_t port, int id,
                                           const Config& config) {
  comm::TCPStore store(client_options(port));
  const comm::Bytes value(static_cast<std::size_t>(config.value_bytes), 'v');
  const std::string prefix = "c" + std::to_string(id) + "/";
  std::vector<std::vector<float>> latencies(kPhaseCount);
  for (int phase = 0; phase < kPhaseCount; ++phase) {
    // Every client arrives, then all start together.
    const std::string gate = std::string("gate/") + kPhases[phase];
    if (store.add(gate, 1) == config.clients)
      store.set_string(gate + "/open", "1");
    store.wait({gate + "/open"});
    latencies[phase].reserve(static_cast<std::size_t>(config.ops));
    for (int i = 0; i < config.ops; ++i) {
      const std::string key = prefix + std::to_string(i);
      const auto start = Clock::now();
      switch (phase) {
        case 0: store.set(key, value); break;
        case 1: (void)store.get(key); break;
        case 2: (void)store.add(prefix + "counter", 1); break;
        case 3: store.wait({key}); break;
      }
      latencies[phase].push_back(
          std::chrono::duration<float, std::micro>(Clock::now() - start)
              .count());
    }
    const std::string done = std::string("done/") + kPhases[phase];
    if (store.add(done, 1) == config.clients)
      store.set_string(done + "/all", "1");
  }
  return latencies;
}

float percentile(std::vector<float>& samples, double p) {
  if (samples.empty()) return 0;
  const auto index =
      static_cast<std::size_t>(p * static_cast<double>(samples.size() - 1));
  std::nth_element(samples.begin(),
                   samples.begin() + static_cast<std::ptrdiff_t>(index),
                   samples.end());
  return samples[index];
}

// Times each phase from the coordinator's side: from the gate opening to
// the last client's "done" (the client that completes the count sets
// done/PHASE/all).
std::vector<double> time_phases(comm::TCPStore& coordinator) {
  std::vector<double> seconds;
  for (const char* phase : kPhases) {
    const std::string gate = std::string("gate/") + phase;
    coordinator.wait({gate + "/open"});
    const auto start = Clock::now();
    coordinator.wait({std::string("done/") + phase + "/all"});
    seconds.push_back(
        std::chrono::duration<double>(Clock::now() - start).count());
  }
  return seconds;
}

// Writes one client's latencies to a pipe / reads them back.
void write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, bytes, size);
    if (n <= 0) return;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}
bool read_all(int fd, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, bytes, size);
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

int run_workload(const Config& config) {
  std::vector<std::vector<std::vector<float>>> results(
      static_cast<std::size_t>(config.clients));
  std::vector<double> phase_seconds;
  if (config.processes) {
    // Fork the clients while this process still has one thread; each waits
    // for the port on its pipe, then sends its latencies back on another.
    std::vector<pid_t> children;
    std::vector<int> port_pipes, result_pipes;
    for (int c = 0; c < config.clients; ++c) {
      int to_child[2], to_parent[2];
      if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
      const pid_t pid = fork();
      if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        std::uint16_t port = 0;
        if (!read_all(to_child[0], &port, sizeof(port))) _exit(1);
        auto latencies = run_client(port, c, config);
        for (auto& phase : latencies) {
          write_all(to_parent[1], phase.data(), phase.size() * sizeof(float));
        }
        _exit(0);
      }
      close(to_child[0]);
      close(to_parent[1]);
      children.push_back(pid);
      port_pipes.push_back(to_child[1]);
      result_pipes.push_back(to_parent[0]);
    }
    comm::TCPStoreServer server;
    for (int fd : port_pipes) {
      const std::uint16_t port = server.port();
      write_all(fd, &port, sizeof(port));
      close(fd);
    }
    comm::TCPStore coordinator(client_options(server.port()));
    phase_seconds = time_phases(coordinator);
    for (int c = 0; c < config.clients; ++c) {
      auto& mine = results[static_cast<std::size_t>(c)];
      mine.assign(kPhaseCount,
                  std::vector<float>(static_cast<std::size_t>(config.ops)));
      for (auto& phase : mine) {
        if (!read_all(result_pipes[static_cast<std::size_t>(c)], phase.data(),
                      phase.size() * sizeof(float))) {
          std::fprintf(stderr, "store_perf: client %d failed\n", c);
          return 1;
        }
      }
      close(result_pipes[static_cast<std::size_t>(c)]);
      waitpid(children[static_cast<std::size_t>(c)], nullptr, 0);
    }
  } else {
    comm::TCPStoreServer server;
    std::vector<std::thread> threads;
    for (int c = 0; c < config.clients; ++c) {
      threads.emplace_back([&, c] {
        results[static_cast<std::size_t>(c)] =
            run_client(server.port(), c, config);
      });
    }
    comm::TCPStore coordinator(client_options(server.port()));
    phase_seconds = time_phases(coordinator);
    for (auto& thread : threads) thread.join();
  }

  std::printf(
      "# libcomm TCPStore: %d %s clients x %d calls per phase, %d-byte "
      "values\n",
      config.clients, config.processes ? "process" : "thread", config.ops,
      config.value_bytes);
  std::printf("%-6s %12s %10s %10s\n", "op", "ops/s", "p50_us", "p99_us");
  for (int phase = 0; phase < kPhaseCount; ++phase) {
    std::vector<float> all;
    for (auto& client : results) {
      all.insert(all.end(), client[phase].begin(), client[phase].end());
    }
    const double rate = static_cast<double>(config.clients) * config.ops /
                        phase_seconds[static_cast<std::size_t>(phase)];
    const float p50 = percentile(all, 0.50);
    const float p99 = percentile(all, 0.99);
    std::printf("%-6s %12.0f %10.1f %10.1f\n", kPhases[phase], rate, p50, p99);
  }
  return 0;
}

int run_rendezvous(const Config& config) {
  comm::TCPStoreServer server;
  const int world = config.rendezvous_world;
  std::vector<std::thread> ranks;
  std::atomic<int> failures{0};
  const auto start = Clock::now();
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        comm::TCPStore store(client_options(server.port()));
        comm::join_ranks(store, rank, world, 120s);
      } catch (const std::exception& e) {
        if (failures++ == 0)
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
    });
  }
  for (auto& rank : ranks) rank.join();
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "# rendezvous of %d ranks (threads, one TCPStore server): %.3f s%s\n",
      world, seconds, failures ? " FAILED" : "");
  return failures ? 1 : 0;
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) /
             1e6;
}

int run_idle(const Config& config) {
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  const rlim_t needed = static_cast<rlim_t>(config.idle_connections) * 2 + 64;
  if (files.rlim_cur < needed) {
    files.rlim_cur = std::min(needed, files.rlim_max);
    setrlimit(RLIMIT_NOFILE, &files);
  }
  comm::TCPStoreServer server;
  std::vector<std::unique_ptr<comm::TCPStore>> clients;
  for (int c = 0; c < config.idle_connections; ++c) {
    clients.push_back(
        std::make_unique<comm::TCPStore>(client_options(server.port())));
  }
  std::printf("# %zu idle connections held by the server\n",
              server.connection_count());
  std::printf("%-8s %10s %12s\n", "window", "seconds", "cpu_percent");
  const auto window = std::chrono::duration<double>(config.idle_seconds);
  for (int w = 1; w <= 3; ++w) {
    const double cpu_before = cpu_seconds();
    const auto start = Clock::now();
    std::this_thread::sleep_for(window);
    const double wall =
        std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("%-8d %10.2f %12.3f\n", w, wall,
                100.0 * (cpu_seconds() - cpu_before) / wall);
  }
  // The server still answers promptly with all of them open.
  clients.front()->set_string("after-idle", "ok");
  return clients.back()->get_string("after-idle") == "ok" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{
      "store_perf: TCPStore throughput, latency, rendezvous and idle cost"};
  app.add_option("--clients", config.clients, "concurrent clients")
      ->check(CLI::Range(1, 4096));
  app.add_option("--ops", config.ops, "calls per client per phase")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--value-bytes", config.value_bytes, "size of each value")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--processes", config.processes,
               "clients are processes, not threads");
  app.add_option("--rendezvous", config.rendezvous_world,
                 "instead: time a rendezvous of this many ranks (threads)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--idle", config.idle_connections,
                 "instead: hold this many idle connections and report CPU use")
      ->check(CLI::Range(1, 100000));
  app.add_option("--idle-seconds", config.idle_seconds,
                 "length of each idle window")
      ->check(CLI::Range(0.1, 600.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (config.rendezvous_world > 0) return run_rendezvous(config);
    if (config.idle_connections > 0) return run_idle(config);
    return run_workload(config);
  } catch (const comm::Error& e) {
    std::fprintf(stderr, "store_perf: %s\n", e.what());
    return 1;
  }
}
