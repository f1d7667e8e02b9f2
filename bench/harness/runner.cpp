#include "bench/harness/runner.h"

#include <sched.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

#include "libcomm/cuda.h"
#include "libcomm/error.h"
#include "libcomm/version.h"

namespace comm::bench {
namespace {

// At most this many operations are in flight with -z 0, so that memory
// stays bounded for any -n. When the queue is full, the older half is
// waited for at once: nccl-tests issues every iteration and waits once, and
// waiting for one operation per operation issued would measure a thread
// wake-up per call instead of the library's pipelined throughput.
constexpr std::size_t kMaxInFlight = 1024;

// nccl-tests' type names.
const char* type_name(DType dtype) {
  switch (dtype) {
    case DType::kF16: return "half";
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float";
    case DType::kF64: return "double";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

const char* average_name(Average average) {
  switch (average) {
    case Average::kRank0: return "rank 0";
    case Average::kMean: return "mean";
    case Average::kMin: return "min";
    case Average::kMax: return "max";
  }
  return "?";
}

// On a CUDA device, wait() may only order the current stream after the
// operation (NCCL's does); the host then waits for the stream, as
// nccl-tests does, so that times cover the operations themselves.
void settle(const Case& c) {
  if (c.device.is_cuda()) synchronize_cuda_stream(c.device.index);
}

// Runs `collective` once and waits for it.
void run_once(const Collective& collective, ProcessGroup& group, Case& c) {
  std::vector<std::shared_ptr<Work>> started;
  collective.start(group, c, started);
  for (const auto& work : started) work->wait();
  settle(c);
}

// This rank's seconds combined across ranks as -a asks.
double combine(ProcessGroup& group, double seconds, Average average) {
  Tensor t = Tensor::full({1}, seconds, DType::kF64);
  switch (average) {
    case Average::kRank0: group.broadcast(t, {.root = 0})->wait(); break;
    case Average::kMean: group.all_reduce(t)->wait(); break;
    case Average::kMin:
      group.all_reduce(t, {.op = ReduceOp::kMin})->wait();
      break;
    case Average::kMax:
      group.all_reduce(t, {.op = ReduceOp::kMax})->wait();
      break;
  }
  const double combined = t.data<double>()[0];
  return average == Average::kMean ? combined / group.size() : combined;
}

std::int64_t sum_over_ranks(ProcessGroup& group, std::int64_t value) {
  Tensor t = Tensor::full({1}, static_cast<double>(value), DType::kI64);
  group.all_reduce(t)->wait();
  return t.data<std::int64_t>()[0];
}

// Drops the buffers of the last run, then makes fresh ones, so that at most
// one set is alive at a time (peak RSS reports the library, not the
// harness's leftovers).
void prepare_fresh(const Collective& collective, Case& c) {
  c.inputs.clear();
  c.outputs.clear();
  c.source = Tensor();
  c.output_user.reset();
  collective.prepare(c);
}

// Rewrites every line of `c`'s inputs (rewrite_lines), then waits for
// every rank to have done so, so that no rank's operation starts, and is
// timed, while a peer still rewrites (a scatter's root has inputs, the
// other ranks none).
void rewrite_inputs(const Case& c, ProcessGroup& group) {
  for (const Tensor& input : c.inputs) {
    rewrite_lines(input.data_ptr(), input.nbytes());
  }
  group.barrier()->wait();
}

Measurement measure(const Collective& collective, Case& c,
                    const Options& options, int iterations,
                    ProcessGroup& group) {
  prepare_fresh(collective, c);
  for (int i = 0; i < options.warmup; ++i) {
    if (options.fresh_inputs) rewrite_inputs(c, group);
    run_once(collective, group, c);
  }
  group.barrier()->wait();
  std::deque<std::shared_ptr<Work>> in_flight;
  std::vector<std::shared_ptr<Work>> started;
  started.reserve(2);  // sendrecv's two; no collective starts more
  const auto start = std::chrono::steady_clock::now();
  // The time spent in rewrite_inputs, left out of the operations'.
  std::chrono::steady_clock::duration rewriting{};
  for (int i = 0; i < iterations; ++i) {
    if (options.fresh_inputs) {
      const auto began = std::chrono::steady_clock::now();
      rewrite_inputs(c, group);
      rewriting += std::chrono::steady_clock::now() - began;
    }
    started.clear();
    collective.start(group, c, started);
    for (auto& work : started) {
      if (options.blocking) {
        work->wait();
        settle(c);
      } else {
        in_flight.push_back(std::move(work));
      }
    }
    if (in_flight.size() > kMaxInFlight) {
      // Operations complete in issue order, so waiting for the newest of
      // the older half waits for all of it, with one wake-up.
      in_flight[in_flight.size() - kMaxInFlight / 2 - 1]->wait();
      while (in_flight.size() > kMaxInFlight / 2) {
        in_flight.front()->wait();
        in_flight.pop_front();
      }
    }
  }
  for (auto& work : in_flight) work->wait();
  settle(c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start -
                                    rewriting)
          .count() /
      iterations;

  Measurement m;
  const double combined = combine(group, seconds, options.average);
  m.time_us = combined * 1e6;
  const auto bytes = collective.bytes_for(c.count, c.dtype, c.world);
  std::tie(m.algbw, m.busbw) = bandwidths(collective, bytes, combined, c.world);
  if (options.check > 0) {
    std::int64_t wrong = 0;
    for (int i = 0; i < options.check; ++i) {
      prepare_fresh(collective, c);
      run_once(collective, group, c);
      wrong += count_wrong(collective, c);
    }
    m.wrong = sum_over_ranks(group, wrong);
  }
  return m;
}

std::string format_time(double us) {
  char text[32];
  std::snprintf(text, sizeof(text),
                us < 1e4   ? "%.2f"
                : us < 1e6 ? "%.1f"
                           : "%.0f",
                us);
  return text;
}

void print_measurement(std::FILE* out, const std::optional<Measurement>& m) {
  if (!m) {
    std::fprintf(out, "  %8s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  std::fprintf(out, "  %8s  %6.2f  %6.2f  ", format_time(m->time_us).c_str(),
               m->algbw, m->busbw);
  if (m->wrong < 0) {
    std::fprintf(out, "%6s", "N/A");
  } else {
    std::fprintf(out, "%6lld", static_cast<long long>(m->wrong));
  }
}

// The CPUs this process may run on, as a list: "0-1", "3".
std::string usable_cpus() {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  if (sched_getaffinity(0, sizeof(usable), &usable) != 0) return "?";
  std::string list;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &usable)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &usable)) ++last;
    list += (list.empty() ? "" : ",") + std::to_string(cpu) +
            (last > cpu ? "-" + std::to_string(last) : "");
    cpu = last;
  }
  return list;
}

void print_header(std::FILE* out, const Collective& collective,
                  const Options& options, ProcessGroup& group, Device device) {
  // Who runs where: every rank's host, pid and device, as nccl-tests lists
  // them.
  constexpr std::int64_t kHostBytes = 64;
  constexpr std::int64_t kCpuBytes = 32;
  constexpr std::int64_t kEntry = kHostBytes + 16 + kCpuBytes;
  Tensor mine = Tensor::zeros({kEntry}, DType::kU8);
  gethostname(static_cast<char*>(mine.data_ptr()), kHostBytes - 1);
  const std::int64_t ids[2] = {getpid(), device.is_cpu() ? -1 : device.index};
  std::memcpy(mine.data<std::uint8_t>() + kHostBytes, ids, sizeof(ids));
  const std::string cpus = usable_cpus().substr(0, kCpuBytes - 1);
  std::memcpy(mine.data<std::uint8_t>() + kHostBytes + 16, cpus.data(),
              cpus.size());
  Tensor all = Tensor::zeros({kEntry * group.size()}, DType::kU8);
  group.all_gather_into(all, mine)->wait();
  if (!out) return;
  const auto sizes = options.sizes();
  std::fprintf(out,
               "# libcomm %d.%d.%d %s_perf: %d ranks, backend %s, %s memory\n",
               COMM_VERSION_MAJOR, COMM_VERSION_MINOR, COMM_VERSION_PATCH,
               collective.name(), group.size(), group.backend_name().c_str(),
               !device.is_cpu()      ? "CUDA"
               : options.shared_host ? "shared host"
                                     : "host");
  std::fprintf(
      out,
      "# minBytes %lld maxBytes %lld step: %lld(%s) warmup iters: %d "
      "iters: %d validation: %d blocking: %d average: %s\n",
      static_cast<long long>(options.min_bytes),
      static_cast<long long>(options.max_bytes),
      static_cast<long long>(options.step_factor > 1 ? options.step_factor
                                                     : options.step_bytes),
      options.step_factor > 1 ? "factor" : "bytes", options.warmup,
      options.iterations, options.check, options.blocking ? 1 : 0,
      average_name(options.average));
  if (options.fresh_inputs) {
    std::fprintf(out,
                 "# fresh inputs: before each operation, warm-up included, "
                 "each rank rewrites its inputs, then the ranks meet in a "
                 "barrier; neither is timed\n");
  }
  if (options.iteration_bytes > 0) {
    std::fprintf(out,
                 "# iters per size: %lld bytes / size, at least 3, at most "
                 "%d\n",
                 static_cast<long long>(options.iteration_bytes),
                 options.iterations);
  }
  std::fprintf(out, "#\n# Using devices\n");
  for (int r = 0; r < group.size(); ++r) {
    const auto* base = all.data<std::uint8_t>() + r * kEntry;
    std::int64_t rank_ids[2];
    std::memcpy(rank_ids, base + kHostBytes, sizeof(rank_ids));
    const std::string where =
        rank_ids[1] < 0 ? "cpu" : "cuda:" + std::to_string(rank_ids[1]);
    std::fprintf(out, "#  Rank %2d Pid %7lld on %10s device %s cpus %s\n", r,
                 static_cast<long long>(rank_ids[0]),
                 reinterpret_cast<const char*>(base), where.c_str(),
                 reinterpret_cast<const char*>(base + kHostBytes + 16));
  }
  std::fprintf(out, "#\n");
  std::fprintf(
      out,
      "# %10s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s  %8s  %6s  %6s  %6s\n",
      "", "", "", "", "", "", "", "out-of-place", "", "", "", "in-place", "");
  std::fprintf(
      out,
      "# %10s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s  %8s  %6s  %6s  %6s\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
      "#wrong", "time", "algbw", "busbw", "#wrong");
  std::fprintf(
      out,
      "# %10s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s  %8s  %6s  %6s  %6s\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
      "(GB/s)", "(GB/s)", "");
  std::fflush(out);
}

std::int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (unsigned char ch : text) {
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", ch);
      quoted += escaped;
    } else {
      quoted += static_cast<char>(ch);
    }
  }
  return quoted + "\"";
}

// JSON has no NaN or infinity; a time of zero gives an infinite bandwidth.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream text;
  text.precision(17);
  text << value;
  return text.str();
}

std::string json_measurement(const std::optional<Measurement>& m) {
  if (!m) return "null";
  return "{\"time_us\": " + json_number(m->time_us) +
         ", \"algbw_gbs\": " + json_number(m->algbw) +
         ", \"busbw_gbs\": " + json_number(m->busbw) + ", \"wrong\": " +
         (m->wrong < 0 ? std::string("null") : std::to_string(m->wrong)) + "}";
}

}  // namespace

std::pair<double, double> bandwidths(const Collective& collective,
                                     std::int64_t bytes, double seconds,
                                     int world) {
  const double algbw = static_cast<double>(bytes) / 1e9 / seconds;
  return {algbw, algbw * collective.bus_factor(world)};
}

void rewrite_lines(void* data, std::size_t bytes) {
  constexpr std::size_t kLine = 64;
  if (bytes == 0) return;
  auto* line = static_cast<volatile std::uint8_t*>(data);
  // A buffer that starts inside a line ends inside one the stride skips.
  for (std::size_t at = 0; at < bytes; at += kLine) line[at] = line[at];
  line[bytes - 1] = line[bytes - 1];
}

Report run_benchmark(const Collective& collective, const Options& options,
                     ProcessGroup& group, Device device, std::FILE* out) {
  if (group.rank() != 0) out = nullptr;
  print_header(out, collective, options, group, device);
  Report report;
  std::vector<int> roots{-1};
  if (collective.uses_root()) {
    if (options.all_roots) {
      roots.clear();
      for (int r = 0; r < group.size(); ++r) roots.push_back(r);
    } else if (options.root >= group.size()) {
      throw InvalidArgument("-r " + std::to_string(options.root) +
                            " is not a rank of the " +
                            std::to_string(group.size()) + "-rank group");
    } else {
      roots = {options.root};
    }
  }
  const std::vector<ReduceOp> no_op{ReduceOp::kSum};
  const auto& ops = collective.uses_op() ? options.ops : no_op;
  double busbw_sum = 0;
  int busbw_count = 0;
  for (DType dtype : options.dtypes) {
    for (ReduceOp op : ops) {
      for (int root : roots) {
        for (std::int64_t size : options.sizes()) {
          Case c;
          c.rank = group.rank();
          c.world = group.size();
          c.dtype = dtype;
          c.op = op;
          c.root = root < 0 ? 0 : root;
          c.count = collective.count_for(size, dtype, c.world);
          c.device = device;
          c.shared_host = options.shared_host;
          c.async_op = !options.blocking;
          Row row;
          row.bytes = collective.bytes_for(c.count, dtype, c.world);
          row.count = c.count;
          row.dtype = dtype;
          if (collective.uses_op()) row.op = op;
          row.root = root;
          const int iterations = options.iterations_for(size);
          row.out_of_place = measure(collective, c, options, iterations, group);
          if (collective.has_in_place()) {
            c.in_place = true;
            row.in_place = measure(collective, c, options, iterations, group);
          }
          for (const auto& m :
               {std::optional(row.out_of_place), row.in_place}) {
            if (!m) continue;
            if (std::isfinite(m->busbw)) {
              busbw_sum += m->busbw;
              ++busbw_count;
            }
            if (m->wrong > 0) report.wrong += m->wrong;
          }
          if (out) {
            std::fprintf(out, "  %10lld  %12zu  %8s  %6s  %6d",
                         static_cast<long long>(row.bytes), row.count,
                         type_name(dtype),
                         row.op ? reduce_op_name(*row.op) : "none", root);
            print_measurement(out, row.out_of_place);
            print_measurement(out, row.in_place);
            std::fprintf(out, "\n");
            std::fflush(out);
          }
          report.rows.push_back(row);
        }
      }
    }
  }
  report.avg_busbw = busbw_count ? busbw_sum / busbw_count : 0;

  Tensor rss =
      Tensor::full({1}, static_cast<double>(peak_rss_bytes()), DType::kI64);
  Tensor all = Tensor::zeros({group.size()}, DType::kI64);
  group.all_gather_into(all, rss)->wait();
  for (int r = 0; r < group.size(); ++r)
    report.peak_rss_bytes.push_back(all.data<std::int64_t>()[r]);

  if (out) {
    std::fprintf(out, "# Out of bounds values : %lld %s\n",
                 static_cast<long long>(report.wrong),
                 options.check == 0  ? "(not checked)"
                 : report.wrong == 0 ? "OK"
                                     : "FAILED");
    std::fprintf(out, "# Avg bus bandwidth    : %g\n", report.avg_busbw);
    std::fprintf(out, "# Peak RSS (MiB)       :");
    for (int r = 0; r < group.size(); ++r) {
      std::fprintf(out, " [%d] %.1f", r,
                   static_cast<double>(report.peak_rss_bytes[r]) / (1 << 20));
    }
    std::fprintf(out, "\n#\n");
    std::fflush(out);
  }
  return report;
}

void write_json(const std::string& path, const std::string& program,
                const Collective& collective, const Options& options, int world,
                const Report& report) {
  std::ostringstream json;
  json << "{\n  \"benchmark\": " << json_string(program)
       << ",\n  \"collective\": " << json_string(collective.name())
       << ",\n  \"libcomm_version\": \"" << COMM_VERSION_MAJOR << "."
       << COMM_VERSION_MINOR << "." << COMM_VERSION_PATCH << "\""
       << ",\n  \"backend\": " << json_string(options.backend)
       << ",\n  \"device\": " << json_string(options.device)
       << ",\n  \"world_size\": " << world
       << ",\n  \"iterations\": " << options.iterations
       << ",\n  \"iteration_bytes\": " << options.iteration_bytes
       << ",\n  \"warmup_iterations\": " << options.warmup
       << ",\n  \"check_iterations\": " << options.check
       << ",\n  \"blocking\": " << (options.blocking ? "true" : "false")
       << ",\n  \"fresh_inputs\": " << (options.fresh_inputs ? "true" : "false")
       << ",\n  \"shared_host\": " << (options.shared_host ? "true" : "false")
       << ",\n  \"average\": " << json_string(average_name(options.average))
       << ",\n  \"results\": [";
  for (std::size_t i = 0; i < report.rows.size(); ++i) {
    const Row& row = report.rows[i];
    json << (i ? "," : "") << "\n    {\"size_bytes\": " << row.bytes
         << ", \"count\": " << row.count
         << ", \"type\": " << json_string(type_name(row.dtype))
         << ", \"redop\": "
         << (row.op ? json_string(reduce_op_name(*row.op)) : "null")
         << ", \"root\": " << row.root
         << ",\n     \"out_of_place\": " << json_measurement(row.out_of_place)
         << ",\n     \"in_place\": " << json_measurement(row.in_place) << "}";
  }
  json << "\n  ],\n  \"avg_busbw_gbs\": " << json_number(report.avg_busbw)
       << ",\n  \"wrong\": " << report.wrong << ",\n  \"peak_rss_bytes\": [";
  for (std::size_t r = 0; r < report.peak_rss_bytes.size(); ++r)
    json << (r ? ", " : "") << report.peak_rss_bytes[r];
  json << "]\n}\n";
  std::ofstream file(path, std::ios::trunc);
  file << json.str();
  file.close();
  if (!file) throw SystemError(errno, "writing the JSON results to " + path);
}

}  // namespace comm::bench
