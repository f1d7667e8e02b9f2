// Symbol visibility. libcomm is built with hidden visibility by default; only
// declarations marked COMM_API are exported from the shared library.
#pragma once

#if defined(COMM_BUILDING_LIBRARY)
#define COMM_API __attribute__((visibility("default")))
#else
#define COMM_API
#endif
