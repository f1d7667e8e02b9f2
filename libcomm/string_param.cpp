#include "libcomm/string_param.h"

namespace comm {

StringParam::StringParam(std::string name, std::string default_text,
                         std::string meaning, ParamVisibility visibility)
    : Param(std::move(name), std::move(meaning),
            visibility == ParamVisibility::kSecret),
      default_text_(std::move(default_text)) {}

std::optional<std::string> StringParam::get() const {
  load();
  return value_;
}

std::string StringParam::type_text() const { return "string"; }

std::string StringParam::default_text() const { return default_text_; }

void StringParam::parse(const std::string& text) const { value_ = text; }

void StringParam::clear() const { value_.reset(); }

std::string StringParam::value_text() const {
  return value_ ? *value_ : "unset";
}

}  // namespace comm
