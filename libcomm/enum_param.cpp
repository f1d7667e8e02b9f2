#include "libcomm/enum_param.h"

#include <algorithm>
#include <stdexcept>

#include "libcomm/detail/strings.h"
#include "libcomm/error.h"

namespace comm {

EnumParam::EnumParam(std::string name, std::initializer_list<const char*> words,
                     std::string default_word, std::string meaning)
    : Param(std::move(name), std::move(meaning)),
      words_(words.begin(), words.end()),
      default_(std::move(default_word)),
      value_(default_) {
  if (std::find(words_.begin(), words_.end(), default_) == words_.end()) {
    throw std::logic_error("knob " + this->name() + ": default '" + default_ +
                           "' is not one of its words");
  }
}

const std::string& EnumParam::get() const {
  load();
  return value_;
}

std::string EnumParam::type_text() const { return "one of " + word_list(); }

std::string EnumParam::default_text() const { return default_; }

void EnumParam::parse(const std::string& text) const {
  const std::string lower = detail::lowercase(text);
  for (const std::string& word : words_) {
    if (detail::lowercase(word) == lower) {
      value_ = word;
      return;
    }
  }
  throw InvalidArgument(
      invalid_message(text, "is not one of " + word_list(), "one of those"));
}

void EnumParam::clear() const { value_ = default_; }

std::string EnumParam::value_text() const { return value_; }

std::string EnumParam::word_list() const {
  std::string list;
  for (const std::string& word : words_) {
    list += (list.empty() ? "" : ", ") + word;
  }
  return list;
}

}  // namespace comm
