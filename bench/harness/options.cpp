#include "bench/harness/options.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>

#include <CLI/CLI.hpp>

#include "libcomm/error.h"
#include "libcomm/param.h"

namespace comm::bench {
namespace {

constexpr std::int64_t kMaxBytes = std::int64_t{1} << 40;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return text;
}

int parse_int(const std::string& flag, const std::string& text, int low,
              int high) {
  // Digits alone, at most 15 of them, so that the value fits before its
  // range is checked; a sign or a suffix is refused with the same message.
  const bool digits =
      !text.empty() && text.size() <= 15 &&
      std::all_of(text.begin(), text.end(),
                  [](unsigned char c) { return std::isdigit(c); });
  const std::int64_t value = digits ? std::stoll(text) : -1;
  if (!digits || value < low || value > high) {
    throw UsageError(flag + " takes an integer from " + std::to_string(low) +
                     " to " + std::to_string(high) + ", not '" + text + "'");
  }
  return static_cast<int>(value);
}

}  // namespace

void check_output_path(const std::string& flag, const std::string& path) {
  struct stat there {};
  if (::lstat(path.c_str(), &there) == 0) {
    if (S_ISDIR(there.st_mode)) {
      throw UsageError(flag + " " + path +
                       " is a directory; give the path of a file");
    }
    // A pipe, a device or a link is left to the writer: opening a pipe
    // here would wait for its reader, and close it for that reader.
    if (!S_ISREG(there.st_mode)) return;
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
      throw UsageError(flag + " " + path + ": " + std::strerror(errno) +
                       "; give a file this user may write");
    }
    ::close(fd);
    return;
  }
  // Made here only to see that it can be, and removed again: O_EXCL, so
  // that what is removed is what this call made.
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw UsageError(flag + " " + path + ": " + std::strerror(errno) +
                     "; give a file in a directory that exists and that "
                     "this user may write to");
  }
  ::close(fd);
  ::unlink(path.c_str());
}

std::int64_t parse_size(const std::string& flag, const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() &&
         std::isdigit(static_cast<unsigned char>(text[digits])))
    ++digits;
  std::int64_t scale = 1;
  const std::string suffix = lower(text.substr(digits));
  if (suffix == "k") {
    scale = std::int64_t{1} << 10;
  } else if (suffix == "m") {
    scale = std::int64_t{1} << 20;
  } else if (suffix == "g") {
    scale = std::int64_t{1} << 30;
  } else if (!suffix.empty()) {
    digits = 0;  // not a size
  }
  if (digits == 0 || digits > 15) {
    throw UsageError(flag +
                     " takes a size in bytes with an optional K, M or G "
                     "suffix (like 1024, 64K or 32M), not '" +
                     text + "'");
  }
  const std::int64_t value = std::stoll(text.substr(0, digits)) * scale;
  if (value > kMaxBytes) {
    throw UsageError(flag + " " + text +
                     " is larger than the 1T this "
                     "benchmark allows");
  }
  return value;
}

int Options::iterations_for(std::int64_t size) const {
  if (iteration_bytes <= 0 || size <= 0) return iterations;
  const std::int64_t fitting = iteration_bytes / size;
  return static_cast<int>(
      std::clamp<std::int64_t>(fitting, std::min(3, iterations), iterations));
}

std::vector<std::int64_t> Options::sizes(std::size_t limit) const {
  std::vector<std::int64_t> sizes;
  // Bounded: each step grows the size by at least one byte or a factor of 2,
  // and parse_options caps the count.
  for (std::int64_t size = min_bytes;
       size <= max_bytes && sizes.size() < limit;) {
    sizes.push_back(size);
    const std::int64_t next =
        step_factor > 1 ? size * step_factor : size + step_bytes;
    if (next <= size) break;
    size = next;
  }
  return sizes;
}

Options parse_options(const std::string& program,
                      const std::vector<std::string>& args) {
  Options options;
  CLI::App app{program +
               ": a libcomm collective's time and bandwidth, "
               "in the style of nccl-tests"};
  app.set_help_flag("-h,--help", "print this help and exit");
  // As in nccl-tests, an option given twice takes its last value.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Words that are not options are collected and refused below, in the
  // order given (CLI11's own message lists them backwards).
  app.allow_extras();
  std::string min_bytes = "32M", max_bytes = "32M", step_bytes = "1M";
  std::string step_factor, iterations = "20", warmup = "5", check = "1";
  std::string dtype = "float", op = "sum", root = "0", average = "1";
  std::string blocking = "0", spawn, timeout = "300", binding = "core";
  std::string iteration_bytes = "0";
  app.add_option("-b,--minbytes", min_bytes, "smallest size (default 32M)");
  app.add_option("-e,--maxbytes", max_bytes, "largest size (default 32M)");
  app.add_option("-i,--stepbytes", step_bytes,
                 "fixed increment between sizes (default 1M)");
  app.add_option("-f,--stepfactor", step_factor,
                 "multiplication factor between sizes (replaces -i)");
  app.add_option("-n,--iters", iterations, "timed iterations (default 20)");
  app.add_option("--iteration-bytes", iteration_bytes,
                 "timed iterations per size: this many bytes / size, at "
                 "least 3 and at most -n (default 0: -n at every size)");
  app.add_option("-w,--warmup_iters", warmup,
                 "untimed iterations before them (default 5)");
  app.add_option("-c,--check", check,
                 "checked runs per case, each counting wrong elements; 0 "
                 "checks nothing (default 1)");
  app.add_option("-d,--datatype", dtype,
                 "float, half, bfloat16, double, int8, uint8, int32, int64 "
                 "or all (default float)");
  app.add_option("-o,--op", op,
                 "sum, prod, min, max, avg or all (default sum)");
  app.add_option("-r,--root", root, "root rank, or all (default 0)");
  app.add_option("-a,--average", average,
                 "how ranks' times combine: 0 rank 0, 1 mean, 2 min, 3 max "
                 "(default 1)");
  app.add_option("-z,--blocking", blocking,
                 "1: wait for each operation before issuing the next "
                 "(default 0)");
  app.add_option("-J,--output_json", options.json_path,
                 "also write the results to this JSON file (rank 0)");
  app.add_option("--backend", options.backend,
                 "tcp or nccl (default tcp); nccl times the operations "
                 "over NCCL and sends the harness's own host tensors over "
                 "tcp");
  app.add_option("--device", options.device,
                 "cpu or cuda (default: cuda for nccl, cpu otherwise)");
  app.add_option("--np", spawn,
                 "start this many local ranks (spelled -np, as in mpirun)");
  app.add_option("--bind-to", binding,
                 "-np ranks: core (rank r on usable CPU r mod their number; "
                 "default), none, or auto (core when the ranks fit the CPUs, "
                 "else none, as mpirun)");
  app.add_option("--timeout", timeout,
                 "seconds each operation may take (default 300)");
  app.add_flag("--fresh-inputs", options.fresh_inputs,
               "before each operation, warm-up included, write every cache "
               "line of the rank's inputs (the same values), as a training "
               "step writes its gradients, then meet the other ranks in a "
               "barrier; neither is timed; needs -z 1 and host memory");
  std::string shared_host = "0";
  app.add_option("-R,--shared-host", shared_host,
                 "1: allocate the buffers in shared host memory "
                 "(allocate_shared_host), which ranks of one host read "
                 "directly, as nccl-tests' -R registers them (default 0)");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print every COMM_* environment variable libcomm reads, with "
               "its value, default and meaning, and exit");

  // nccl-tests and mpirun users type -np; CLI11's short options are one
  // letter, so it is rewritten before parsing.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  for (auto& arg : reversed) {
    if (arg == "-np") arg = "--np";
  }
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested(app.help());
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  if (std::vector<std::string> extras = app.remaining(); !extras.empty()) {
    std::string words;
    for (const std::string& word : extras) {
      words += (words.empty() ? "" : " ") + word;
    }
    throw UsageError("unexpected argument" +
                     std::string(extras.size() == 1 ? "" : "s") + ": " + words);
  }
  if (print_config) throw HelpRequested(comm::format_params());

  options.min_bytes = parse_size("-b", min_bytes);
  options.max_bytes = parse_size("-e", max_bytes);
  options.step_bytes = parse_size("-i", step_bytes);
  if (options.min_bytes > options.max_bytes) {
    // One of them may be the default, which the user did not type.
    const bool min_given = app.count("-b") > 0;
    const bool max_given = app.count("-e") > 0;
    throw UsageError(
        "-b " + min_bytes + (min_given ? "" : " (the default)") +
        " is larger than -e " + max_bytes +
        (max_given ? "" : " (the default)") +
        (min_given && max_given
             ? std::string()
             : std::string("; give ") + (min_given ? "-e" : "-b") + " too"));
  }
  if (!step_factor.empty()) {
    options.step_factor = parse_int("-f", step_factor, 2, 1 << 20);
  } else if (options.step_bytes <= 0) {
    throw UsageError("-i takes a positive increment, not '" + step_bytes + "'");
  }
  if (options.sizes(10001).size() > 10000) {
    throw UsageError(
        "-b " + min_bytes + " to -e " + max_bytes + " with " +
        (step_factor.empty() ? "-i " + step_bytes : "-f " + step_factor) +
        " makes more than 10000 sizes; use a larger step");
  }
  options.iterations = parse_int("-n", iterations, 1, 1 << 24);
  options.warmup = parse_int("-w", warmup, 0, 1 << 24);
  options.iteration_bytes = parse_size("--iteration-bytes", iteration_bytes);
  options.check = parse_int("-c", check, 0, 1 << 16);
  try {
    options.dtypes =
        lower(dtype) == "all"
            ? std::vector<DType>{DType::kI8,  DType::kU8,  DType::kI32,
                                 DType::kI64, DType::kF16, DType::kF32,
                                 DType::kF64, DType::kBF16}
            : std::vector<DType>{parse_dtype(dtype)};
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("-d: ") + e.what());
  }
  try {
    options.ops =
        lower(op) == "all"
            ? std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kProduct,
                                    ReduceOp::kMax, ReduceOp::kMin,
                                    ReduceOp::kAvg}
            : std::vector<ReduceOp>{parse_reduce_op(op)};
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("-o: ") + e.what());
  }
  if (lower(root) == "all") {
    options.all_roots = true;
  } else {
    options.root = parse_int("-r", root, 0, 1 << 20);
  }
  options.average = static_cast<Average>(parse_int("-a", average, 0, 3));
  options.blocking = parse_int("-z", blocking, 0, 1) == 1;
  if (!spawn.empty()) options.spawn = parse_int("-np", spawn, 1, 1024);
  options.timeout =
      std::chrono::seconds(parse_int("--timeout", timeout, 1, 7 * 24 * 3600));
  if (const std::string bind = lower(binding); bind == "core") {
    options.binding = Options::Binding::kCore;
  } else if (bind == "none") {
    options.binding = Options::Binding::kNone;
  } else if (bind == "auto") {
    options.binding = Options::Binding::kAuto;
  } else {
    throw UsageError("--bind-to takes core, none or auto, not '" + binding +
                     "'");
  }
  if (options.device.empty()) {
    options.device = options.backend == "nccl" ? "cuda" : "cpu";
  }
  if (options.device != "cpu" && options.device != "cuda") {
    throw UsageError("--device takes cpu or cuda, not '" + options.device +
                     "'");
  }
  if (options.fresh_inputs && !options.blocking) {
    throw UsageError(
        "--fresh-inputs writes the inputs between operations, so it needs "
        "-z 1 (without it, operations in flight read them)");
  }
  options.shared_host = parse_int("-R", shared_host, 0, 1) == 1;
  if (options.shared_host && options.device != "cpu") {
    throw UsageError(
        "-R 1 allocates shared host memory; it has no meaning for --device "
        "cuda");
  }
  if (options.fresh_inputs && options.device != "cpu") {
    throw UsageError(
        "--fresh-inputs writes host memory; it has no meaning for --device "
        "cuda");
  }
  return options;
}

}  // namespace comm::bench
