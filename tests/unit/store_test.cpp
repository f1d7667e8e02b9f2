// The Store contract, checked on every store: HashStore, PrefixStore,
// FileStore and TCPStore (with its server in this process).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/error.h"
#include "store/file_store.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"
#include "support/temp_path.h"

using comm::Bytes;
using comm::Store;
using comm::to_bytes;
using namespace std::chrono_literals;

namespace {

// Builds one kind of store, and more handles onto the same data (another
// client, another FileStore on the same file) for concurrency tests.
class StoreFixture {
 public:
  explicit StoreFixture(const std::string& kind)
      : kind_(kind), path_("store_test") {
    if (kind == "hash") {
      shared_ = std::make_shared<comm::HashStore>();
    } else if (kind == "prefix") {
      shared_ = std::make_shared<comm::PrefixStore>(
          "job", std::make_shared<comm::HashStore>());
    } else if (kind == "file") {
      shared_ = std::make_shared<comm::FileStore>(path_.str());
    } else {
      comm::TCPStoreOptions options;
      options.port = 0;
      options.is_server = true;
      options.timeout = 30s;
      options.token = "";
      auto host = std::make_shared<comm::TCPStore>(options);
      port_ = host->port();
      shared_ = host;
    }
  }

  Store& store() { return *shared_; }

  // Another handle onto the same keys.
  std::shared_ptr<Store> another() {
    if (kind_ == "hash" || kind_ == "prefix") return shared_;
    if (kind_ == "file") return std::make_shared<comm::FileStore>(path_.str());
    comm::TCPStoreOptions options;
    options.port = port_;
    options.timeout = 30s;
    options.token = "";
    return std::make_shared<comm::TCPStore>(options);
  }

 private:
  std::string kind_;
  comm::testing::TempPath path_;
  std::uint16_t port_ = 0;
  std::shared_ptr<Store> shared_;
};

std::string kind_under_test() {
  return GENERATE(as<std::string>{}, "hash", "prefix", "file", "tcp");
}

}  // namespace

TEST_CASE("set, get, check, delete_key and num_keys", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  Store& store = fixture.store();

  CHECK_FALSE(store.check({"a"}));
  store.set("a", to_bytes("alpha"));
  store.set_string("b", "beta");
  CHECK(store.get("a") == to_bytes("alpha"));
  CHECK(store.get_string("b") == "beta");
  CHECK(store.check({"a", "b"}));
  CHECK_FALSE(store.check({"a", "c"}));
  if (kind != "prefix") CHECK(store.num_keys() == 2);
  store.set("a", to_bytes("replaced"));
  CHECK(store.get_string("a") == "replaced");
  store.set("empty", Bytes{});
  CHECK(store.get("empty").empty());
  Bytes binary = {0, 255, 10, 0, 13};
  store.set("binary", binary);
  CHECK(store.get("binary") == binary);

  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK_FALSE(store.check({"a"}));
  if (kind != "prefix") CHECK(store.num_keys() == 3);
}

TEST_CASE("add is an atomic counter kept as decimal text", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  Store& store = fixture.store();
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get_string("n") == "-2");
  store.set_string("text", "not a number");
  CHECK_THROWS_AS(store.add("text", 1), comm::InvalidArgument);
  CHECK(store.get_string("text") == "not a number");
  // The store still works after refusing.
  CHECK(store.add("n", 2) == 0);
}

TEST_CASE("compare_set follows c10d", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  Store& store = fixture.store();
  // Missing key, non-empty expected: nothing stored, expected returned.
  CHECK(store.compare_set("k", to_bytes("x"), to_bytes("y")) == to_bytes("x"));
  CHECK_FALSE(store.check({"k"}));
  // Missing key, empty expected: stored.
  CHECK(store.compare_set("k", {}, to_bytes("first")) == to_bytes("first"));
  // Mismatch: the current value comes back, unchanged.
  CHECK(store.compare_set("k", to_bytes("other"), to_bytes("z")) ==
        to_bytes("first"));
  // Match: replaced.
  CHECK(store.compare_set("k", to_bytes("first"), to_bytes("second")) ==
        to_bytes("second"));
  CHECK(store.get_string("k") == "second");
}

TEST_CASE("multi_set, multi_get and append", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  Store& store = fixture.store();
  store.multi_set({"x", "y", "z"},
                  {to_bytes("1"), to_bytes("22"), to_bytes("333")});
  CHECK(store.multi_get({"z", "x"}) ==
        std::vector<Bytes>{to_bytes("333"), to_bytes("1")});
  CHECK_THROWS_AS(store.multi_set({"a", "b"}, {to_bytes("1")}),
                  comm::InvalidArgument);
  // Empty lists are answered at once on every store; a TCPStore client
  // stays usable after them (its server drops a frame without keys).
  store.wait({}, 100ms);
  CHECK(store.check({}));
  CHECK(store.multi_get({}).empty());
  store.multi_set({}, {});
  CHECK(store.get_string("x") == "1");
  store.append("log", to_bytes("ab"));
  store.append("log", to_bytes("cd"));
  CHECK(store.get_string("log") == "abcd");
}

TEST_CASE("get and wait block until another client sets the key", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  auto other = fixture.another();
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other->set_string("late", "here");
    std::this_thread::sleep_for(50ms);
    other->add("later", 1);
  });
  CHECK(fixture.store().get_string("late", 20s) == "here");
  fixture.store().wait({"late", "later"}, 20s);
  CHECK(fixture.store().get_string("later") == "1");
  setter.join();
}

TEST_CASE("a timeout names the keys and fires on time", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  fixture.store().set_string("present", "1");
  const auto timeout = 1000ms;
  const auto start = std::chrono::steady_clock::now();
  // The message names the key still missing, not the one that was set.
  CHECK_THROWS_WITH(fixture.store().wait({"present", "missing"}, timeout),
                    Catch::Contains("missing'") &&
                        !Catch::Contains("present") &&
                        Catch::Contains("1000 ms"));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= timeout);
  CHECK(waited <= timeout * 11 / 10);
  CHECK_THROWS_AS(fixture.store().get("missing", 50ms), comm::TimeoutError);
  // The store is usable after a timeout.
  fixture.store().set_string("missing", "now");
  CHECK(fixture.store().get_string("missing", 1s) == "now");
}

TEST_CASE("keys and values over the limits are InvalidArgument",
          "[store][limits]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  const std::string long_key(Store::kMaxKeySize + 1, 'k');
  CHECK_THROWS_AS(fixture.store().set(long_key, to_bytes("v")),
                  comm::InvalidArgument);
  CHECK_THROWS_AS(fixture.store().get(long_key, 10ms), comm::InvalidArgument);
  CHECK_THROWS_WITH(fixture.store().set("big", Bytes(Store::kMaxValueSize + 1)),
                    Catch::Contains("limit"));
  // At the limits exactly, both work (PrefixStore adds "job/" to the key).
  const std::string max_key(Store::kMaxKeySize - (kind == "prefix" ? 4 : 0),
                            'k');
  fixture.store().set(max_key, Bytes(Store::kMaxValueSize, 7));
  CHECK(fixture.store().get(max_key).size() == Store::kMaxValueSize);
}

TEST_CASE("an append past the value limit is refused and changes nothing",
          "[store][limits]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  Store& store = fixture.store();
  store.set("grow", Bytes(Store::kMaxValueSize - 10, 1));
  CHECK_THROWS_WITH(store.append("grow", Bytes(11, 2)),
                    Catch::Contains("over the limit"));
  CHECK(store.get("grow").size() == Store::kMaxValueSize - 10);
  store.append("grow", Bytes(10, 2));
  const Bytes full = store.get("grow");
  CHECK(full.size() == Store::kMaxValueSize);
  CHECK(full.back() == 2);
  CHECK(store.add("counter", 1) == 1);  // the store is still usable
}

TEST_CASE("a TCPStore get whose reply is over the frame limit is refused",
          "[store][limits]") {
  StoreFixture fixture("tcp");
  Store& store = fixture.store();
  store.set("large", Bytes(Store::kMaxValueSize, 3));
  CHECK_THROWS_WITH(store.multi_get({"large", "large"}, 10s),
                    Catch::Contains("smaller groups"));
  // One large value, many times: refused before the reply is built.
  std::vector<std::string> repeated(64, "large");
  CHECK_THROWS_AS(store.multi_get(repeated, 10s), comm::InvalidArgument);
  // The refusal left the connection usable.
  CHECK(store.get("large").size() == Store::kMaxValueSize);
  CHECK(store.add("counter", 2) == 2);
}

TEST_CASE("32 threads adding to one key sum exactly", "[store]") {
  const std::string kind = kind_under_test();
  INFO("store: " << kind);
  StoreFixture fixture(kind);
  constexpr int kThreads = 32;
  constexpr int kAddsPerThread = 50;
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Store>> handles;
  for (int t = 0; t < kThreads; ++t) handles.push_back(fixture.another());
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) handles[t]->add("counter", 1);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(fixture.store().add("counter", 0) == kThreads * kAddsPerThread);
}

TEST_CASE("PrefixStore scopes keys under its prefix", "[store]") {
  auto base = std::make_shared<comm::HashStore>();
  comm::PrefixStore group("group1", base);
  comm::PrefixStore nested("sub",
                           std::make_shared<comm::PrefixStore>("group1", base));
  group.set_string("k", "v");
  CHECK(base->get_string("group1/k") == "v");
  CHECK_FALSE(base->check({"k"}));
  nested.set_string("k", "w");
  CHECK(base->get_string("group1/sub/k") == "w");
  CHECK_THROWS_WITH(group.get("absent", 10ms),
                    Catch::Contains("'group1/absent'"));
}

TEST_CASE("derive_key gives a key only where there is a token", "[store]") {
  comm::HashStore hash;
  CHECK(hash.derive_key("purpose").empty());
  CHECK(comm::PrefixStore("p", std::make_shared<comm::HashStore>())
            .derive_key("purpose")
            .empty());
  comm::TCPStoreOptions options;
  options.port = 0;
  options.is_server = true;
  options.timeout = 30s;
  options.token = "";
  CHECK(comm::TCPStore(options).derive_key("purpose").empty());
  options.token = "job-secret";
  comm::TCPStore with_token(options);
  const comm::Bytes key = with_token.derive_key("purpose");
  CHECK(key.size() == 32);
  CHECK(key != with_token.derive_key("another purpose"));
  // Nothing of the token shows in the key.
  const std::string text(key.begin(), key.end());
  CHECK(text.find("job-secret") == std::string::npos);
}
