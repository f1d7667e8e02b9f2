// Logging. libcomm writes its log to stderr through spdlog; every line carries
// the host name, the process id and, once the process knows it, its rank.
//
// The level comes from the environment variable COMM_LOG_LEVEL, one of
// off, error, warn, info, debug, trace (default warn), read the first time the
// log is used. An unknown value is reported on the log and replaced by warn.
#pragma once

#include <string_view>

#include "libcomm/export.h"

namespace comm {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// The level in force. Lines below it are neither formatted nor written.
COMM_API LogLevel log_level();

// Overrides COMM_LOG_LEVEL for this process from now on.
COMM_API void set_log_level(LogLevel level);

// Adds "rank N" to every line logged from now on. Called by rendezvous once
// the rank is known; a negative rank removes it again.
COMM_API void set_log_rank(int rank);

// Parses one of off|error|warn|info|debug|trace (case-insensitive). Throws
// InvalidArgument naming the value and the accepted ones otherwise.
COMM_API LogLevel parse_log_level(std::string_view text);

}  // namespace comm
