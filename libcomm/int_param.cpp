#include "libcomm/int_param.h"

namespace comm {

IntParam::IntParam(std::string name, std::int64_t default_value,
                   std::int64_t min, std::int64_t max, std::string meaning)
    : Param(std::move(name), std::move(meaning)),
      default_(default_value),
      min_(min),
      max_(max),
      value_(default_value) {}

std::int64_t IntParam::get() const {
  load();
  return value_;
}

std::string IntParam::type_text() const {
  return integer_type_text(min_, max_);
}

std::string IntParam::default_text() const { return std::to_string(default_); }

void IntParam::parse(const std::string& text) const {
  value_ = parse_integer(text, min_, max_);
}

void IntParam::clear() const { value_ = default_; }

std::string IntParam::value_text() const { return std::to_string(value_); }

}  // namespace comm
