#include "libcomm/logging.h"

#include <unistd.h>

#include <memory>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>

#include "libcomm/detail/log.h"
#include "libcomm/detail/strings.h"
#include "libcomm/enum_param.h"
#include "libcomm/error.h"

namespace comm {
namespace {

constexpr const char* kLevelNames[] = {"trace", "debug", "info",
                                       "warn",  "error", "off"};

const EnumParam kLogLevel{"COMM_LOG_LEVEL",
                          {"off", "error", "warn", "info", "debug", "trace"},
                          "warn",
                          "the least severe log lines written to stderr"};

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// "[time] [level] [host:pid rank R] message". The host, pid and rank are
// baked into the pattern rather than formatted on every line.
std::string make_pattern(int rank) {
  std::string origin = host_name() + ":" + std::to_string(getpid());
  if (rank >= 0) origin += " rank " + std::to_string(rank);
  return "[%Y-%m-%d %H:%M:%S.%e] [%l] [" + origin + "] %v";
}

struct LoggerState {
  std::shared_ptr<spdlog::logger> logger;

  LoggerState() {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    logger = std::make_shared<spdlog::logger>("libcomm", std::move(sink));
    logger->set_pattern(make_pattern(-1));
    logger->set_level(spdlog::level::warn);
    logger->flush_on(spdlog::level::trace);
    // The log cannot throw, since it is used everywhere, destructors
    // included: a bad level is reported on the log itself instead.
    try {
      logger->set_level(to_spdlog(parse_log_level(kLogLevel.get())));
    } catch (const InvalidArgument& e) {
      logger->warn("{}; using warn", e.what());
    }
  }
};

LoggerState& state() {
  static LoggerState instance;
  return instance;
}

}  // namespace

namespace detail {
spdlog::logger& logger() { return *state().logger; }
}  // namespace detail

LogLevel log_level() {
  switch (state().logger->level()) {
    case spdlog::level::trace: return LogLevel::kTrace;
    case spdlog::level::debug: return LogLevel::kDebug;
    case spdlog::level::info: return LogLevel::kInfo;
    case spdlog::level::warn: return LogLevel::kWarn;
    case spdlog::level::err:
    case spdlog::level::critical: return LogLevel::kError;
    default: return LogLevel::kOff;
  }
}

void set_log_level(LogLevel level) {
  state().logger->set_level(to_spdlog(level));
}

void set_log_rank(int rank) { state().logger->set_pattern(make_pattern(rank)); }

LogLevel parse_log_level(std::string_view text) {
  const std::string lower = detail::lowercase(text);
  for (int i = 0; i < 6; ++i) {
    if (lower == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  throw InvalidArgument("COMM_LOG_LEVEL='" + std::string(text) +
                        "' is not a log level; use one of off, error, warn, "
                        "info, debug, trace");
}

}  // namespace comm
