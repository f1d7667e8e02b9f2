// rendezvous() and join_ranks(): URL and environment parsing, and joins of
// ranks run as threads (failures across real processes are in the
// multiproc suite).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/rendezvous.h"
#include "libcomm/error.h"
#include "store/hash_store.h"
#include "support/env_is.h"
#include "support/rank_checks.h"
#include "support/temp_path.h"

using comm::testing::EnvIs;
using comm::testing::expect;
using namespace std::chrono_literals;

namespace {

// The variables of env:// as `vars` gives them, the others unset, for one
// test.
EnvIs rendezvous_env(
    std::initializer_list<std::pair<const char*, const char*>> vars) {
  EnvIs::Values values;
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                           "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    values.emplace_back(name, nullptr);
  }
  values.insert(values.end(), vars.begin(), vars.end());
  return EnvIs(values);
}

// Throws where a rank's thread finds something wrong: Catch2's assertions
// are not thread-safe, so rank threads report through run_ranks' errors.
// Runs `world` ranks as threads; returns each rank's error message, empty
// where the rank succeeded.
template <typename F>
std::vector<std::string> run_ranks(int world, F body) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

}  // namespace

TEST_CASE("env:// names the missing or malformed variable", "[rendezvous]") {
  {
    const auto env = rendezvous_env(
        {{"MASTER_PORT", "29500"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"),
                      Catch::Contains("MASTER_ADDR"));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "http"},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "1"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"),
                      Catch::Contains("MASTER_PORT='http'"));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "70000"},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "1"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"), Catch::Contains("70000"));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "0"},
                                     {"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"), Catch::Contains("RANK"));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "0"},
                                     {"RANK", "2"},
                                     {"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"),
                      Catch::Contains("rank 2 is outside [0, 2)"));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "0"},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "0"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"),
                      Catch::Contains("WORLD_SIZE='0' is not an integer in "
                                      "[1, "));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "0"},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "abc"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"),
                      Catch::Contains("WORLD_SIZE='abc' is not an integer in "
                                      "[1, "));
  }
  {
    const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "0"},
                                     {"RANK", "x1"},
                                     {"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(comm::rendezvous("env://"), Catch::Contains("RANK='x1'"));
  }
}

TEST_CASE("env:// with one rank hosts the store and reads LOCAL_*",
          "[rendezvous]") {
  const auto env = rendezvous_env({{"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", "0"},
                                   {"RANK", "0"},
                                   {"WORLD_SIZE", "1"},
                                   {"LOCAL_RANK", "0"},
                                   {"LOCAL_WORLD_SIZE", "1"}});
  comm::RendezvousResult joined = comm::rendezvous("env://", -1, -1, 10s);
  CHECK(joined.rank == 0);
  CHECK(joined.world_size == 1);
  CHECK(joined.local_rank == 0);
  CHECK(joined.local_world_size == 1);
  joined.store->set_string("usable", "yes");
  CHECK(joined.store->get_string("usable") == "yes");
}

TEST_CASE("malformed URLs are InvalidArgument", "[rendezvous]") {
  CHECK_THROWS_WITH(comm::rendezvous("127.0.0.1:29500"),
                    Catch::Contains("not a URL"));
  CHECK_THROWS_WITH(comm::rendezvous("udp://h:1?rank=0&world_size=1"),
                    Catch::Contains("'udp'"));
  CHECK_THROWS_WITH(comm::rendezvous("tcp://127.0.0.1?rank=0&world_size=1"),
                    Catch::Contains("HOST:PORT"));
  CHECK_THROWS_WITH(comm::rendezvous("tcp://127.0.0.1:1?world_size=1"),
                    Catch::Contains("rank="));
  CHECK_THROWS_WITH(
      comm::rendezvous("tcp://127.0.0.1:1?rank=zero&world_size=1"),
      Catch::Contains("'zero'"));
  CHECK_THROWS_WITH(comm::rendezvous("file://relative?rank=0&world_size=1"),
                    Catch::Contains("absolute path"));
}

TEST_CASE("8 ranks join over tcp:// and see one store", "[rendezvous]") {
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port()) +
      "?world_size=8";
  std::vector<std::shared_ptr<comm::Store>> stores(8);
  auto errors = run_ranks(8, [&](int rank) {
    auto joined =
        comm::rendezvous(url + "&rank=" + std::to_string(rank), -1, -1, 30s);
    expect(joined.world_size == 8,
           "world_size " + std::to_string(joined.world_size));
    joined.store->add("sum", rank);
    joined.store->add("done", 1);
    joined.store->wait({"done"}, 30s);
    stores[rank] = joined.store;  // keep rank 0's server up until all finish
  });
  for (const auto& error : errors) CHECK(error == "");
  CHECK(stores[3]->get_string("sum") == "28");
}

TEST_CASE("ranks join over file://", "[rendezvous]") {
  comm::testing::TempPath path("rendezvous_file");
  const std::string url = "file://" + path.str() + "?world_size=4";
  auto errors = run_ranks(4, [&](int rank) {
    auto joined =
        comm::rendezvous(url + "&rank=" + std::to_string(rank), -1, -1, 30s);
    expect(joined.rank == rank, "rank " + std::to_string(joined.rank));
  });
  for (const auto& error : errors) CHECK(error == "");
  CHECK(access(path.str().c_str(), F_OK) != 0);  // the last user removed it
}

TEST_CASE("a malformed COMM_RDZV_TIMEOUT fails every init method",
          "[rendezvous]") {
  // env:// is the only one that uses it; the others must not ignore it.
  comm::testing::TempPath path("rendezvous_knob");
  const EnvIs bad({{"COMM_RDZV_TIMEOUT", "5s"}});
  CHECK_THROWS_WITH(
      comm::rendezvous("file://" + path.str() + "?world_size=1&rank=0"),
      Catch::Contains("COMM_RDZV_TIMEOUT='5s' is not an integer"));
}

TEST_CASE("a rank claimed twice fails both claimants", "[rendezvous]") {
  comm::HashStore store;
  // Ranks 0, 1, 1: world size 3, so rank 2 never comes.
  auto errors = run_ranks(3, [&](int thread) {
    comm::join_ranks(store, thread == 0 ? 0 : 1, 3, 20s);
  });
  int claimed_twice = 0;
  for (const auto& error : errors) {
    // Two jobs on one store look the same: the message names both causes.
    if (error.find("rank 1 is claimed twice") != std::string::npos &&
        error.find("each job its own store") != std::string::npos)
      ++claimed_twice;
  }
  // Both processes that claimed rank 1 fail, and so does rank 0, which the
  // conflict wakes instead of leaving it to time out.
  CHECK(claimed_twice == 3);
}

TEST_CASE("ranks that disagree on the world size fail", "[rendezvous]") {
  comm::HashStore store;
  auto errors = run_ranks(2, [&](int rank) {
    if (rank == 1) std::this_thread::sleep_for(50ms);
    comm::join_ranks(store, rank, rank == 0 ? 2 : 3, 20s);
  });
  // The late rank names the one that set the world size first.
  CHECK_THAT(errors[1],
             Catch::Contains("world_size 3") &&
                 Catch::Contains("but rank 0 (") &&
                 Catch::Contains(") joined first with world_size 2"));
  CHECK_THAT(errors[0], Catch::Contains("WORLD_SIZE"));
}

TEST_CASE("a join that times out names the missing ranks", "[rendezvous]") {
  comm::HashStore store;
  auto errors = run_ranks(2, [&](int thread) {
    comm::join_ranks(store, thread == 0 ? 0 : 2, 5, 300ms);
  });
  for (const auto& error : errors) {
    CHECK_THAT(error, Catch::Contains("2 of 5 ranks arrived") &&
                          Catch::Contains("missing ranks 1, 3, 4"));
  }
}
