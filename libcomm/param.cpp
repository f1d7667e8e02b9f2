#include "libcomm/param.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>

#include "libcomm/error.h"

namespace comm {
namespace {

// The process-wide list of declarations. A function-local static, so that it
// exists before the first declaration registers itself, whatever order the
// translation units' static initialisers run in.
struct Registry {
  std::mutex mutex;
  std::vector<const Param*> params;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

// The declarations, sorted by name, under the registry's lock.
std::vector<const Param*> sorted_params() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<const Param*> params = r.params;
  std::sort(params.begin(), params.end(), [](const Param* a, const Param* b) {
    return a->name() < b->name();
  });
  return params;
}

}  // namespace

Param::Param(std::string name, std::string meaning, bool secret)
    : name_(std::move(name)), meaning_(std::move(meaning)), secret_(secret) {
  if (name_.rfind("COMM_", 0) != 0) {
    throw std::logic_error("knob " + name_ + " does not start with COMM_");
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.params.push_back(this);
}

Param::~Param() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::erase(r.params, this);
}

void Param::load_quietly() const {
  if (loaded_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex_);
  if (loaded_.load(std::memory_order_relaxed)) return;
  const char* text = std::getenv(name_.c_str());
  from_environment_ = text != nullptr && *text != '\0';
  error_.clear();
  clear();
  if (from_environment_) {
    try {
      parse(text);
    } catch (const InvalidArgument& e) {
      error_ = e.what();
      clear();
    }
  }
  loaded_.store(true, std::memory_order_release);
}

void Param::load_or_throw() const {
  load_quietly();
  if (!error_.empty()) throw InvalidArgument(error_);
}

void Param::reset() const {
  std::lock_guard lock(mutex_);
  loaded_.store(false, std::memory_order_release);
}

ParamInfo Param::info() const {
  load_quietly();
  ParamInfo info;
  info.name = name_;
  info.type = type_text();
  info.default_value = default_text();
  info.meaning = meaning_;
  info.from_environment = from_environment_;
  info.error = error_;
  if (secret_) {
    info.value = from_environment_ ? "set" : "unset";
  } else {
    info.value = value_text();
  }
  return info;
}

std::string Param::invalid_message(const std::string& text,
                                   const std::string& problem,
                                   const std::string& accepted) const {
  // A secret's value is not repeated, not even in an error.
  const std::string shown = secret_ ? "<secret>" : text;
  return name_ + "='" + shown + "' " + problem + "; set it to " + accepted +
         " or unset it (default " + default_text() + ")";
}

std::int64_t Param::parse_integer(const std::string& text, std::int64_t min,
                                  std::int64_t max) const {
  const std::string accepted =
      "an integer from " + std::to_string(min) + " to " + std::to_string(max);
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    throw InvalidArgument(invalid_message(text, "is out of range", accepted));
  }
  if (ec != std::errc() || stop != end) {
    throw InvalidArgument(invalid_message(text, "is not an integer", accepted));
  }
  if (value < min || value > max) {
    throw InvalidArgument(invalid_message(text, "is out of range", accepted));
  }
  return value;
}

std::string Param::integer_type_text(std::int64_t min, std::int64_t max) {
  return "integer from " + std::to_string(min) + " to " + std::to_string(max);
}

std::vector<ParamInfo> list_params() {
  std::vector<ParamInfo> infos;
  for (const Param* param : sorted_params()) infos.push_back(param->info());
  return infos;
}

std::string format_params() {
  std::string text;
  for (const ParamInfo& info : list_params()) {
    text += info.name + " = ";
    if (!info.error.empty()) {
      text += "(invalid) " + info.error + "\n";
    } else {
      text += info.value + (info.from_environment ? " (from the environment)\n"
                                                  : " (default)\n");
    }
    text += "    " + info.type + "; default " + info.default_value + "\n";
    text += "    " + info.meaning + "\n";
  }
  return text;
}

void read_params(std::string_view prefix) {
  for (const Param* param : sorted_params()) {
    if (param->name().starts_with(prefix)) param->load();
  }
}

void reset_params() {
  for (const Param* param : sorted_params()) param->reset();
}

}  // namespace comm
