#include "libcomm/distributed/rendezvous.h"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
#include <thread>

#include "libcomm/detail/log.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "libcomm/logging.h"
#include "libcomm/optional_int_param.h"
#include "libcomm/param.h"
#include "store/file_store.h"
#include "store/store_barrier.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

namespace comm {
namespace {

constexpr const char* kJoinPrefix = "rendezvous/";

const OptionalIntParam kRdzvTimeout{
    "COMM_RDZV_TIMEOUT", "the caller's timeout", 1, 1 << 30,
    "seconds an env:// rendezvous may take, in place of the caller's timeout"};

// Parses a whole decimal integer in [low, high]; `what` names the source
// in the error ("RANK", "the rank= parameter of tcp://...").
long parse_integer(const std::string& text, const std::string& what, long low,
                   long high) {
  long value = 0;
  auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      value < low || value > high) {
    throw InvalidArgument(what + "='" + text + "' is not an integer in [" +
                          std::to_string(low) + ", " + std::to_string(high) +
                          "]");
  }
  return value;
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string required_env(const char* name, const char* advice) {
  auto value = env(name);
  if (!value || value->empty()) {
    throw InvalidArgument(std::string("init_method env:// needs ") + name +
                          ", which is not set; " + advice);
  }
  return *value;
}

struct ParsedUrl {
  std::string scheme;  // "env", "tcp" or "file"
  std::string rest;    // after "://", without the query
  std::map<std::string, std::string> query;
};

ParsedUrl parse_url(const std::string& url) {
  const auto separator = url.find("://");
  if (separator == std::string::npos) {
    throw InvalidArgument("init_method '" + url +
                          "' is not a URL; use env://, tcp://HOST:PORT or "
                          "file:///PATH");
  }
  ParsedUrl parsed;
  parsed.scheme = url.substr(0, separator);
  std::string rest = url.substr(separator + 3);
  const auto question = rest.find('?');
  if (question != std::string::npos) {
    std::string query = rest.substr(question + 1);
    rest.resize(question);
    std::size_t start = 0;
    while (start <= query.size()) {
      std::size_t end = query.find('&', start);
      if (end == std::string::npos) end = query.size();
      const std::string pair = query.substr(start, end - start);
      if (!pair.empty()) {
        const auto equals = pair.find('=');
        if (equals == std::string::npos) {
          throw InvalidArgument("init_method '" + url + "': query item '" +
                                pair + "' is not NAME=VALUE");
        }
        parsed.query[pair.substr(0, equals)] = pair.substr(equals + 1);
      }
      start = end + 1;
    }
  }
  parsed.rest = rest;
  return parsed;
}

// Splits "host:port" or "[v6]:port".
void split_host_port(const std::string& url, const std::string& text,
                     std::string* host, std::uint16_t* port) {
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      throw InvalidArgument("init_method '" + url +
                            "': expected [IPV6]:PORT after tcp://");
    }
    *host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      throw InvalidArgument("init_method '" + url +
                            "': expected HOST:PORT after tcp://");
    }
    *host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  *port = static_cast<std::uint16_t>(parse_integer(
      port_text, "the port of init_method '" + url + "'", 0, 65535));
}

void check_rank(int rank, int world_size) {
  if (world_size < 1) {
    throw InvalidArgument("world_size is " + std::to_string(world_size) +
                          "; it must be at least 1");
  }
  if (rank < 0 || rank >= world_size) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside [0, " +
                          std::to_string(world_size) + ") for world_size " +
                          std::to_string(world_size));
  }
}

// Names one join attempt: the host and pid tell a person which process it
// was, and the per-process count keeps two joins of one process (threads in
// a test, a retried join) apart.
std::string join_identity() {
  static std::atomic<int> joins{0};
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + " pid " + std::to_string(getpid()) + " join " +
         std::to_string(joins.fetch_add(1));
}

}  // namespace

void join_ranks(Store& store, int rank, int world_size,
                Store::Duration timeout) {
  check_rank(rank, world_size);
  const std::string prefix = kJoinPrefix;
  const StoreBarrier joined{store, prefix, rank, world_size, "rendezvous"};
  const std::string me = join_identity();

  // "<world size> by rank <r> (<identity>)", from the first rank to join.
  const std::string claim = std::to_string(world_size) + " by rank " +
                            std::to_string(rank) + " (" + me + ")";
  const std::string claimed_world =
      to_string(store.compare_set(prefix + "world_size", {}, to_bytes(claim)));
  const std::string claimed_size =
      claimed_world.substr(0, claimed_world.find(' '));
  if (claimed_size != std::to_string(world_size)) {
    const auto by = claimed_world.find(" by ");
    const std::string problem =
        "rank " + std::to_string(rank) + " (" + me +
        ") was started with world_size " + std::to_string(world_size) +
        " but " +
        (by == std::string::npos ? std::string("an earlier rank")
                                 : claimed_world.substr(by + 4)) +
        " joined first with world_size " + claimed_size +
        "; start every rank with the same WORLD_SIZE";
    fail_barrier(joined, problem);
    throw InvalidArgument("rendezvous failed: " + problem);
  }
  const std::string rank_key = prefix + "rank/" + std::to_string(rank);
  const std::string owner =
      to_string(store.compare_set(rank_key, {}, to_bytes(me)));
  if (owner != me) {
    const std::string problem = "rank " + std::to_string(rank) +
                                " is claimed twice, by " + owner + " and by " +
                                me +
                                "; give each process its own RANK, and each "
                                "job its own store (MASTER_ADDR and "
                                "MASTER_PORT, or init_method)";
    // Wakes every waiting rank, the first claimant included, with the news.
    fail_barrier(joined, problem);
    throw InvalidArgument("rendezvous failed: " + problem);
  }
  // The claim of rank/R above marks this rank arrived.
  const std::string problem = arrive_and_wait(joined, timeout, /*marked=*/true);
  if (!problem.empty()) {
    throw InvalidArgument("rendezvous failed for rank " + std::to_string(rank) +
                          " (" + me + "): " + problem);
  }
  COMM_LOG_INFO("rendezvous: rank {} of {} joined", rank, world_size);
}

RendezvousResult rendezvous(const std::string& init_method, int rank,
                            int world_size, Store::Duration timeout) {
  // Only env:// uses them, but a bad value fails with any init method
  // rather than go unnoticed where it is not used.
  read_params("COMM_RDZV_");
  const ParsedUrl url = parse_url(init_method);
  RendezvousResult result;
  auto from_query = [&](const char* name, int given) {
    if (given >= 0) return given;
    auto it = url.query.find(name);
    if (it == url.query.end()) {
      throw InvalidArgument(
          "init_method '" + init_method + "' needs " + name +
          "=...; add it to the URL or pass it as an argument");
    }
    return static_cast<int>(parse_integer(
        it->second,
        std::string("the ") + name + " parameter of '" + init_method + "'",
        std::string_view(name) == "world_size" ? 1 : 0, 1 << 30));
  };

  std::string host;
  std::uint16_t port = 0;
  if (url.scheme == "env") {
    host =
        required_env("MASTER_ADDR",
                     "set it to the address of rank 0's host, e.g. 127.0.0.1");
    port = static_cast<std::uint16_t>(parse_integer(
        required_env("MASTER_PORT",
                     "set it to a free port on rank 0's host, e.g. 29500"),
        "MASTER_PORT", 0, 65535));
    result.rank =
        rank >= 0 ? rank
                  : static_cast<int>(parse_integer(
                        required_env("RANK", "set it to this process's rank"),
                        "RANK", 0, 1 << 30));
    result.world_size =
        world_size >= 0
            ? world_size
            : static_cast<int>(parse_integer(
                  required_env("WORLD_SIZE", "set it to the number of ranks"),
                  "WORLD_SIZE", 1, 1 << 30));
    if (auto local = env("LOCAL_RANK")) {
      result.local_rank =
          static_cast<int>(parse_integer(*local, "LOCAL_RANK", 0, 1 << 30));
    }
    if (auto local = env("LOCAL_WORLD_SIZE")) {
      result.local_world_size = static_cast<int>(
          parse_integer(*local, "LOCAL_WORLD_SIZE", 1, 1 << 30));
    }
    if (auto seconds = kRdzvTimeout.get()) {
      timeout = std::chrono::seconds(*seconds);
    }
  } else if (url.scheme == "tcp") {
    split_host_port(init_method, url.rest, &host, &port);
    result.rank = from_query("rank", rank);
    result.world_size = from_query("world_size", world_size);
  } else if (url.scheme == "file") {
    if (url.rest.empty() || url.rest.front() != '/') {
      throw InvalidArgument("init_method '" + init_method +
                            "' needs an absolute path: file:///PATH");
    }
    result.rank = from_query("rank", rank);
    result.world_size = from_query("world_size", world_size);
  } else {
    throw InvalidArgument("init_method '" + init_method + "' has scheme '" +
                          url.scheme + "'; use env://, tcp:// or file://");
  }
  check_rank(result.rank, result.world_size);
  set_log_rank(result.rank);

  if (url.scheme == "file") {
    result.store = std::make_shared<FileStore>(url.rest, timeout);
  } else {
    TCPStoreOptions options;
    options.host = host;
    options.port = port;
    options.is_server = result.rank == 0;
    options.timeout = timeout;
    result.store = std::make_shared<TCPStore>(options);
  }
  try {
    join_ranks(*result.store, result.rank, result.world_size, timeout);
  } catch (const Error&) {
    // A failed rendezvous fails every rank, each reading why from the store.
    // Rank 0 holds that store: it stays up until the others have read the
    // news and hung up (bounded), rather than cutting off one still on
    // its way in, who would learn only that the server went away.
    if (auto* tcp = dynamic_cast<TCPStore*>(result.store.get());
        tcp != nullptr && tcp->server() != nullptr) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (tcp->server()->connection_count() > 1 &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    throw;
  }
  return result;
}

}  // namespace comm
