// The TCP backend's control message: encode and decode round-trip, and
// decode refuses whatever does not fit the bytes it is given.
#include <catch2/catch.hpp>

#include <cstring>

#include "backends/tcp/control_message.h"

using comm::ErrorKind;
using comm::tcp::CallState;
using comm::tcp::Collective;
using comm::tcp::ControlKind;
using comm::tcp::ControlMessage;

namespace {

ControlMessage sample() {
  ControlMessage message;
  message.call.collective = Collective::kAllReduce;
  message.call.sequence = 12;
  message.call.dtype = comm::DType::kF32;
  message.call.count = 1024;
  message.call.op = comm::ReduceOp::kMax;
  message.call.root = -1;
  message.error = ErrorKind::kTimeout;
  message.blamed = 3;
  message.waiting_for = {2, 0};
  message.text = "all_reduce #12 timed out";
  return message;
}

}  // namespace

TEST_CASE("a control message survives encode and decode") {
  const ControlMessage sent = sample();
  const std::vector<std::uint8_t> bytes = sent.encode();
  REQUIRE(bytes.size() > ControlMessage::kPrefixSize);
  REQUIRE(ControlMessage::body_size(bytes.data()) ==
          bytes.size() - ControlMessage::kPrefixSize);
  const auto got = ControlMessage::decode(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK(got->kind == ControlKind::kAbort);
  CHECK(got->call == sent.call);
  CHECK(got->error == sent.error);
  CHECK(got->blamed == sent.blamed);
  CHECK(got->waiting_for == sent.waiting_for);
  CHECK(got->text == sent.text);
}

TEST_CASE("a heartbeat is a prefix alone and survives encode and decode") {
  ControlMessage beat;
  beat.kind = ControlKind::kHeartbeat;
  const std::vector<std::uint8_t> bytes = beat.encode();
  REQUIRE(bytes.size() == ControlMessage::kPrefixSize);
  CHECK(ControlMessage::body_size(bytes.data()) == 0u);
  const auto got = ControlMessage::decode(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK(got->kind == ControlKind::kHeartbeat);
  // A heartbeat with a body is malformed.
  std::vector<std::uint8_t> bad = sample().encode();
  bad[5] = static_cast<std::uint8_t>(ControlKind::kHeartbeat);
  CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
}

TEST_CASE("a query and its answer survive encode and decode") {
  ControlMessage answer = sample();
  answer.kind = ControlKind::kAnswer;
  answer.state = CallState::kStarted;
  answer.call.root = 2;
  const std::vector<std::uint8_t> bytes = answer.encode();
  const auto got = ControlMessage::decode(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK(got->kind == ControlKind::kAnswer);
  CHECK(got->state == CallState::kStarted);
  CHECK(got->call == answer.call);
  ControlMessage query;
  query.kind = ControlKind::kQuery;
  query.call = answer.call;
  const std::vector<std::uint8_t> asked = query.encode();
  const auto read = ControlMessage::decode(asked.data(), asked.size());
  REQUIRE(read);
  CHECK(read->kind == ControlKind::kQuery);
  CHECK(read->state == CallState::kNone);
  CHECK(read->call == query.call);
}

TEST_CASE(
    "a departure survives encode and decode, and the next kind does not") {
  ControlMessage leaving = sample();
  leaving.kind = ControlKind::kLeaving;
  leaving.state = CallState::kStarted;
  leaving.text = "after 3 collectives, the last all_reduce #2";
  const std::vector<std::uint8_t> bytes = leaving.encode();
  const auto got = ControlMessage::decode(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK(got->kind == ControlKind::kLeaving);
  CHECK(got->state == CallState::kStarted);
  CHECK(got->call == leaving.call);
  CHECK(got->text == leaving.text);
  std::vector<std::uint8_t> unknown = bytes;
  unknown[5] = static_cast<std::uint8_t>(ControlKind::kLeaving) + 1;
  CHECK_FALSE(ControlMessage::decode(unknown.data(), unknown.size()));
}

TEST_CASE("a control message's text is cut to what a reader accepts") {
  ControlMessage sent = sample();
  sent.text.assign(100000, 'x');
  const std::vector<std::uint8_t> bytes = sent.encode();
  CHECK(bytes.size() ==
        ControlMessage::kPrefixSize + ControlMessage::kMaxBodyBytes);
  const auto got = ControlMessage::decode(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK(got->text.size() < sent.text.size());
}

TEST_CASE("a control message's rank list is cut to what a reader accepts") {
  ControlMessage sent = sample();
  sent.waiting_for.assign(100000, 7);
  const std::vector<std::uint8_t> bytes = sent.encode();
  CHECK(bytes.size() <=
        ControlMessage::kPrefixSize + ControlMessage::kMaxBodyBytes);
  const auto got = ControlMessage::decode(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK_FALSE(got->waiting_for.empty());
  CHECK(got->waiting_for.size() < sent.waiting_for.size());
}

TEST_CASE("decode refuses malformed control messages") {
  const std::vector<std::uint8_t> good = sample().encode();
  SECTION("every truncation") {
    for (std::size_t size = 0; size < good.size(); ++size) {
      CHECK_FALSE(ControlMessage::decode(good.data(), size));
    }
  }
  SECTION("a bad magic, version or kind") {
    for (std::size_t at : {0, 4, 5}) {
      std::vector<std::uint8_t> bad = good;
      bad[at] ^= 0x5a;
      CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
    }
  }
  SECTION("an unknown kind or answer state") {
    std::vector<std::uint8_t> bad = good;
    bad[5] = 9;  // kind
    CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
    bad = good;
    bad[ControlMessage::kPrefixSize + 25] = 9;  // state
    CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
  }
  SECTION("an unknown collective or error kind") {
    std::vector<std::uint8_t> bad = good;
    bad[ControlMessage::kPrefixSize] = 0;  // collective 0
    CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
    bad = good;
    bad[ControlMessage::kPrefixSize + 24] = 200;  // error kind
    CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
  }
  SECTION("a rank list longer than the body") {
    std::vector<std::uint8_t> bad = good;
    const std::uint32_t huge = 0x40000000;
    std::memcpy(bad.data() + ControlMessage::kPrefixSize + 32, &huge, 4);
    CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
  }
  SECTION("a body larger than a reader accepts") {
    std::vector<std::uint8_t> bad = good;
    const std::uint32_t huge = ControlMessage::kMaxBodyBytes + 1;
    std::memcpy(bad.data() + 8, &huge, 4);
    CHECK_FALSE(ControlMessage::body_size(bad.data()));
  }
  SECTION("bytes left over") {
    std::vector<std::uint8_t> bad = good;
    bad.push_back(0);
    CHECK_FALSE(ControlMessage::decode(bad.data(), bad.size()));
  }
}
