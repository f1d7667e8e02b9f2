#include "libcomm/optional_int_param.h"

namespace comm {

OptionalIntParam::OptionalIntParam(std::string name, std::string default_text,
                                   std::int64_t min, std::int64_t max,
                                   std::string meaning)
    : Param(std::move(name), std::move(meaning)),
      default_text_(std::move(default_text)),
      min_(min),
      max_(max) {}

std::optional<std::int64_t> OptionalIntParam::get() const {
  load();
  return value_;
}

std::string OptionalIntParam::type_text() const {
  return integer_type_text(min_, max_);
}

std::string OptionalIntParam::default_text() const { return default_text_; }

void OptionalIntParam::parse(const std::string& text) const {
  value_ = parse_integer(text, min_, max_);
}

void OptionalIntParam::clear() const { value_.reset(); }

std::string OptionalIntParam::value_text() const {
  return value_ ? std::to_string(*value_) : "unset";
}

}  // namespace comm
