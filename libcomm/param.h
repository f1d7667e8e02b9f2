// Tuning knobs: the COMM_* environment variables libcomm reads.
//
// Each knob is declared once, at namespace scope in the file that uses it, as
// one of the Param subclasses (IntParam, OptionalIntParam, EnumParam,
// StringParam) with its name, type, default and a one-line meaning. The
// declaration registers itself in one process-wide list, which list_params()
// returns, format_params() prints (the bench's --print-config, the C API's
// comm_config_dump) and a unit test compares with README.md's table.
//
// A knob is read from the environment the first time it is used and cached
// for the life of the process; reads are thread-safe. An empty value counts
// as unset. A value that does not parse, has anything after the number or
// word, or lies outside the accepted range is an InvalidArgument naming the
// variable, the value and what would be accepted; it is thrown by every use
// of the knob, never replaced by the default in silence.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "libcomm/export.h"

namespace comm {

// One knob as list_params() reports it.
struct ParamInfo {
  std::string name;           // "COMM_TCP_SPIN_US"
  std::string type;           // "integer from 0 to 10000", "one of a, b"
  std::string default_value;  // what applies when it is unset
  std::string meaning;        // one line
  // The value in force: the parsed value, or the default when unset. A
  // secret knob's value is only ever "set" or "unset".
  std::string value;
  bool from_environment = false;  // whether the environment set it
  std::string error;  // the InvalidArgument message when the value is bad
};

// The declaration of one knob; the subclasses add its type and typed value.
// Declarations live at namespace scope for the life of the process and are
// neither copied nor moved, since the process-wide list points at them.
class COMM_API Param {
 public:
  Param(const Param&) = delete;
  Param& operator=(const Param&) = delete;

  const std::string& name() const { return name_; }
  const std::string& meaning() const { return meaning_; }

  // The knob as list_params() reports it. Never throws: a bad value is
  // reported in ParamInfo::error.
  ParamInfo info() const;

  // Reads the environment now if that has not happened yet. Throws the
  // knob's InvalidArgument if its value is bad.
  void load() const {
    // Inline, as knobs read on every call come here each time.
    if (!loaded_.load(std::memory_order_acquire) || !error_.empty())
      load_or_throw();
  }

  // Forgets the cached value, so that the next use reads the environment
  // again. For tests; see reset_params(). Declarations are const objects,
  // so this touches only the cache, which is mutable.
  void reset() const;

 protected:
  // Registers the knob in the process-wide list. `name` must start with
  // "COMM_".
  Param(std::string name, std::string meaning, bool secret = false);
  ~Param();

  // The subclass's description of its accepted values and of its default.
  virtual std::string type_text() const = 0;
  virtual std::string default_text() const = 0;
  // Parses a non-empty value from the environment into the typed value, or
  // throws InvalidArgument. Called once, under the knob's lock.
  virtual void parse(const std::string& text) const = 0;
  // Puts the typed value back to "unset".
  virtual void clear() const = 0;
  // The typed value in force, as text (the default when unset).
  virtual std::string value_text() const = 0;

  // The message of an InvalidArgument for `text`: "NAME='text' <problem>;
  // set it to <accepted> or unset it (default <default>)".
  std::string invalid_message(const std::string& text,
                              const std::string& problem,
                              const std::string& accepted) const;

  // Parses a whole decimal integer from `min` to `max`, or throws
  // InvalidArgument naming the knob.
  std::int64_t parse_integer(const std::string& text, std::int64_t min,
                             std::int64_t max) const;
  static std::string integer_type_text(std::int64_t min, std::int64_t max);

 private:
  // Reads and parses the environment once; records a bad value's message
  // instead of throwing it.
  void load_quietly() const;
  // load() past its fast path.
  void load_or_throw() const;

  std::string name_;
  std::string meaning_;
  bool secret_;
  mutable std::mutex mutex_;
  mutable std::atomic<bool> loaded_{false};
  mutable bool from_environment_ = false;
  mutable std::string error_;
};

// Every declared knob, sorted by name.
COMM_API std::vector<ParamInfo> list_params();

// list_params() as text for people: per knob, a line "NAME = value (source)"
// then its type and default, and its meaning, each indented.
COMM_API std::string format_params();

// Reads every knob whose name starts with `prefix` now, so that a bad value
// fails here (at process-group creation, say) rather than in the middle of
// a collective. Throws the first InvalidArgument, in name order.
COMM_API void read_params(std::string_view prefix);

// For tests that change the environment at run time: forgets every cached
// value, so that each knob reads the environment again at its next use. Not
// thread-safe against concurrent uses of the knobs, and code that keeps a
// value it read earlier (a constructed backend) keeps it.
COMM_API void reset_params();

}  // namespace comm
