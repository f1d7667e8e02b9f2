#include "libcomm/device.h"

#include <charconv>

#include "libcomm/error.h"

namespace comm {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view kPrefix = "cuda:";
  if (text.starts_with(kPrefix)) {
    std::string_view digits = text.substr(kPrefix.size());
    int ordinal = -1;
    auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
    if (ec == std::errc() && end == digits.data() + digits.size() &&
        !digits.empty() && ordinal >= 0) {
      return cuda(ordinal);
    }
  }
  throw InvalidArgument("'" + std::string(text) +
                        "' is not a device; use cpu, cuda or cuda:N");
}

}  // namespace comm
