// The library's internal logging macros. This header is not installed: spdlog
// stays an implementation detail, so users of libcomm need not have it.
#pragma once

#include <spdlog/logger.h>

#include "libcomm/export.h"

namespace comm::detail {

// The libcomm logger, configured from COMM_LOG_LEVEL on first use. It is not
// registered in spdlog's global registry, so an application's own spdlog
// set-up neither sees nor disturbs it.
COMM_API spdlog::logger& logger();

}  // namespace comm::detail

#define COMM_LOG_TRACE(...) ::comm::detail::logger().trace(__VA_ARGS__)
#define COMM_LOG_DEBUG(...) ::comm::detail::logger().debug(__VA_ARGS__)
#define COMM_LOG_INFO(...) ::comm::detail::logger().info(__VA_ARGS__)
#define COMM_LOG_WARN(...) ::comm::detail::logger().warn(__VA_ARGS__)
#define COMM_LOG_ERROR(...) ::comm::detail::logger().error(__VA_ARGS__)
