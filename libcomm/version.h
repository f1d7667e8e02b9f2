// The version of libcomm. meson.build reads these three lines to version the
// shared library and the pkg-config file, so they are the only place the
// version is written.
#pragma once

#define COMM_VERSION_MAJOR 0
#define COMM_VERSION_MINOR 1
#define COMM_VERSION_PATCH 0

// One integer that orders versions: 10000 * major + 100 * minor + patch.
#define COMM_VERSION_CODE \
  (COMM_VERSION_MAJOR * 10000 + COMM_VERSION_MINOR * 100 + COMM_VERSION_PATCH)
