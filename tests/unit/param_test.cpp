// The knobs of libcomm/param.h: strict parsing, reading once, listing, and a
// bad TCP knob failing at backend construction. The knobs declared here
// (COMM_PARAM_TEST_*) exist only in this program, which changes their
// environment at run time and calls reset_params() after each change.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp/tcp_backend.h"
#include "libcomm/enum_param.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"
#include "libcomm/optional_int_param.h"
#include "libcomm/param.h"
#include "libcomm/string_param.h"
#include "store/hash_store.h"

namespace {

const comm::IntParam kCount{"COMM_PARAM_TEST_COUNT", 7, 0, 100,
                            "a test integer"};
const comm::OptionalIntParam kLimit{"COMM_PARAM_TEST_LIMIT",
                                    "twice the world size", -5, 5,
                                    "a test integer with a computed default"};
const comm::EnumParam kMode{
    "COMM_PARAM_TEST_MODE", {"fast", "Careful", "off"}, "fast", "a test word"};
const comm::StringParam kName{"COMM_PARAM_TEST_NAME", "the host name",
                              "a test string"};
const comm::StringParam kSecret{"COMM_PARAM_TEST_SECRET", "no secret",
                                "a test secret",
                                comm::ParamVisibility::kSecret};

// Sets (or, with nullptr, unsets) one variable for a test and forgets every
// cached knob, so that the next use reads the new value; undoes both after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* value) {
    if (value != nullptr) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
    comm::reset_params();
  }

  std::string name_;
  std::optional<std::string> old_;
};

comm::ParamInfo info_of(const std::string& name) {
  for (const comm::ParamInfo& info : comm::list_params()) {
    if (info.name == name) return info;
  }
  FAIL(name << " is not listed");
  return {};
}

}  // namespace

TEST_CASE("an unset or empty knob has its default", "[param]") {
  ScopedEnv count("COMM_PARAM_TEST_COUNT", nullptr);
  ScopedEnv limit("COMM_PARAM_TEST_LIMIT", "");
  ScopedEnv mode("COMM_PARAM_TEST_MODE", nullptr);
  ScopedEnv name("COMM_PARAM_TEST_NAME", "");
  CHECK(kCount.get() == 7);
  CHECK(kLimit.get() == std::nullopt);
  CHECK(kMode.get() == "fast");
  CHECK(kName.get() == std::nullopt);
}

TEST_CASE("integer knobs take whole decimal integers in their range",
          "[param]") {
  {
    ScopedEnv env("COMM_PARAM_TEST_COUNT", "100");
    CHECK(kCount.get() == 100);
  }
  {
    ScopedEnv env("COMM_PARAM_TEST_COUNT", "0");
    CHECK(kCount.get() == 0);
  }
  {
    ScopedEnv env("COMM_PARAM_TEST_LIMIT", "-5");
    CHECK(kLimit.get() == -5);
  }
}

TEST_CASE("a bad integer names the variable, the value and the range",
          "[param]") {
  const auto accepted = Catch::Contains(
      "; set it to an integer from 0 to 100 or unset it (default 7)");
  SECTION("not a number") {
    ScopedEnv env("COMM_PARAM_TEST_COUNT", "abc");
    CHECK_THROWS_WITH(
        kCount.get(),
        Catch::StartsWith("COMM_PARAM_TEST_COUNT='abc' is not an integer") &&
            accepted);
  }
  SECTION("trailing garbage") {
    for (const char* value : {"12abc", "12 ", " 12", "1e3", "0x10", "+5"}) {
      INFO(value);
      ScopedEnv env("COMM_PARAM_TEST_COUNT", value);
      CHECK_THROWS_WITH(
          kCount.get(),
          Catch::Contains(std::string("='") + value + "' is not an integer") &&
              accepted);
    }
  }
  SECTION("out of range") {
    for (const char* value : {"101", "-1", "99999999999999999999"}) {
      INFO(value);
      ScopedEnv env("COMM_PARAM_TEST_COUNT", value);
      CHECK_THROWS_WITH(
          kCount.get(),
          Catch::Contains(std::string("='") + value + "' is out of range") &&
              accepted);
    }
  }
  SECTION("a computed default is named in the error") {
    ScopedEnv env("COMM_PARAM_TEST_LIMIT", "6");
    CHECK_THROWS_WITH(
        kLimit.get(),
        Catch::Equals("COMM_PARAM_TEST_LIMIT='6' is out of range; set it to "
                      "an integer from -5 to 5 or unset it (default twice "
                      "the world size)"));
  }
  SECTION("every use throws, not only the first") {
    ScopedEnv env("COMM_PARAM_TEST_COUNT", "abc");
    CHECK_THROWS_AS(kCount.get(), comm::InvalidArgument);
    CHECK_THROWS_AS(kCount.get(), comm::InvalidArgument);
  }
}

TEST_CASE("enum knobs take one of their words, ignoring case", "[param]") {
  {
    ScopedEnv env("COMM_PARAM_TEST_MODE", "CAREFUL");
    CHECK(kMode.get() == "Careful");
  }
  {
    ScopedEnv env("COMM_PARAM_TEST_MODE", "off");
    CHECK(kMode.get() == "off");
  }
  for (const char* value : {"slow", "off ", "fastest"}) {
    INFO(value);
    ScopedEnv env("COMM_PARAM_TEST_MODE", value);
    CHECK_THROWS_WITH(
        kMode.get(),
        Catch::Equals(std::string("COMM_PARAM_TEST_MODE='") + value +
                      "' is not one of fast, Careful, off; set "
                      "it to one of those or unset it (default "
                      "fast)"));
  }
}

TEST_CASE("a knob is read once, until reset_params", "[param]") {
  ScopedEnv env("COMM_PARAM_TEST_COUNT", "3");
  CHECK(kCount.get() == 3);
  setenv("COMM_PARAM_TEST_COUNT", "4", 1);
  CHECK(kCount.get() == 3);
  comm::reset_params();
  CHECK(kCount.get() == 4);
}

TEST_CASE("the first read is safe from many threads at once", "[param]") {
  ScopedEnv env("COMM_PARAM_TEST_COUNT", "42");
  std::vector<std::int64_t> seen(8, -1);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] { seen[i] = kCount.get(); });
  }
  for (auto& thread : threads) thread.join();
  CHECK(std::count(seen.begin(), seen.end(), 42) == 8);
}

TEST_CASE("list_params reports every knob with its value and source",
          "[param]") {
  ScopedEnv count("COMM_PARAM_TEST_COUNT", "9");
  ScopedEnv limit("COMM_PARAM_TEST_LIMIT", nullptr);
  ScopedEnv mode("COMM_PARAM_TEST_MODE", "nonsense");
  ScopedEnv secret("COMM_PARAM_TEST_SECRET", "hunter2");

  const std::vector<comm::ParamInfo> all = comm::list_params();
  CHECK(std::is_sorted(
      all.begin(), all.end(),
      [](const auto& a, const auto& b) { return a.name < b.name; }));
  for (const char* name : {"COMM_LOG_LEVEL", "COMM_TCP_RING_THRESHOLD_BYTES",
                           "COMM_STORE_TOKEN", "COMM_REDUCE_KERNELS"}) {
    INFO(name);
    CHECK(std::count_if(all.begin(), all.end(), [&](const auto& info) {
            return info.name == name;
          }) == 1);
  }

  const comm::ParamInfo c = info_of("COMM_PARAM_TEST_COUNT");
  CHECK(c.type == "integer from 0 to 100");
  CHECK(c.default_value == "7");
  CHECK(c.meaning == "a test integer");
  CHECK(c.value == "9");
  CHECK(c.from_environment);
  CHECK(c.error.empty());

  const comm::ParamInfo l = info_of("COMM_PARAM_TEST_LIMIT");
  CHECK(l.default_value == "twice the world size");
  CHECK(l.value == "unset");
  CHECK_FALSE(l.from_environment);

  const comm::ParamInfo m = info_of("COMM_PARAM_TEST_MODE");
  CHECK(m.type == "one of fast, Careful, off");
  CHECK(m.from_environment);
  CHECK_THAT(m.error,
             Catch::StartsWith("COMM_PARAM_TEST_MODE='nonsense' is not one"));

  const comm::ParamInfo s = info_of("COMM_PARAM_TEST_SECRET");
  CHECK(s.type == "string");
  CHECK(s.value == "set");
  CHECK(s.from_environment);
  CHECK(kSecret.get() == "hunter2");

  const std::string text = comm::format_params();
  CHECK_THAT(text, Catch::Contains("COMM_PARAM_TEST_COUNT = 9 (from the "
                                   "environment)\n    integer from 0 to 100; "
                                   "default 7\n    a test integer\n"));
  CHECK_THAT(text, Catch::Contains("COMM_PARAM_TEST_LIMIT = unset (default)"));
  CHECK_THAT(text, Catch::Contains("COMM_PARAM_TEST_MODE = (invalid) "
                                   "COMM_PARAM_TEST_MODE='nonsense'"));
  CHECK_THAT(text, Catch::Contains("COMM_PARAM_TEST_SECRET = set (from the "
                                   "environment)"));
  CHECK_THAT(text, !Catch::Contains("hunter2"));
}

TEST_CASE("read_params reads the knobs under a prefix now", "[param]") {
  ScopedEnv count("COMM_PARAM_TEST_COUNT", "x");
  CHECK_THROWS_WITH(comm::read_params("COMM_PARAM_TEST_"),
                    Catch::Contains("COMM_PARAM_TEST_COUNT='x'"));
  CHECK_NOTHROW(comm::read_params("COMM_PARAM_TEST_MODE"));
}

TEST_CASE("a bad TCP knob fails TcpBackend construction", "[param][tcp]") {
  for (const char* name :
       {"COMM_TCP_RING_THRESHOLD_BYTES", "COMM_TCP_CHUNK_BYTES",
        "COMM_TCP_SPIN_US", "COMM_TCP_LOCAL_SNDBUF_BYTES",
        "COMM_TCP_NETNS_SNDBUF_BYTES"}) {
    INFO(name);
    ScopedEnv env(name, "abc");
    auto store = std::make_shared<comm::HashStore>();
    CHECK_THROWS_WITH(
        comm::TcpBackend(store, 0, 1, std::chrono::seconds(10)),
        Catch::StartsWith(std::string(name) + "='abc' is not an integer"));
  }
  {
    ScopedEnv env("COMM_REDUCE_KERNELS", "fastest");
    auto store = std::make_shared<comm::HashStore>();
    CHECK_THROWS_WITH(
        comm::TcpBackend(store, 0, 1, std::chrono::seconds(10)),
        Catch::StartsWith("COMM_REDUCE_KERNELS='fastest' is not one of auto, "
                          "portable"));
  }
  auto store = std::make_shared<comm::HashStore>();
  CHECK_NOTHROW(comm::TcpBackend(store, 0, 1, std::chrono::seconds(10)));
}
