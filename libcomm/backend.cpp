#include "libcomm/backend.h"

namespace comm {

Backend::Backend(int rank, int size) : rank_(rank), size_(size) {}
Backend::~Backend() = default;

}  // namespace comm
