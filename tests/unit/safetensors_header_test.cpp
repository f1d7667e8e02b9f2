// comm::detail::parse_safetensors_header: the checkpoint loader's parser of
// a safetensors file's JSON header, on header text alone.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "libcomm/distributed/ddp/safetensors_header.h"
#include "libcomm/error.h"

using comm::DType;
using comm::detail::parse_safetensors_header;

namespace {

// What the loader throws for `header` over `data_bytes` bytes of data, or
// "" when it parses.
std::string refusal(const std::string& header, std::uint64_t data_bytes = 64) {
  try {
    parse_safetensors_header(header, data_bytes, "x.safetensors", nullptr);
  } catch (const comm::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a well-formed header gives its entries in file order and metadata",
          "[checkpoint][safetensors]") {
  const std::string header =
      R"({"__metadata__":{"format":"pt","note":"a\"b\u00e9"},)"
      R"( "w" : {"dtype":"BF16","shape":[2, 3],"data_offsets":[0,12]},)"
      R"("b":{"shape":[],"data_offsets":[12,16],"dtype":"F32"},)"
      R"("e":{"dtype":"I64","shape":[0],"data_offsets":[16,16]}}   )";
  std::map<std::string, std::string> metadata;
  const auto entries =
      parse_safetensors_header(header, 16, "x.safetensors", &metadata);
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].name == "w");
  CHECK(entries[0].dtype == DType::kBF16);
  CHECK(entries[0].shape == comm::Shape{2, 3});
  CHECK(entries[0].begin == 0);
  CHECK(entries[0].end == 12);
  CHECK(entries[1].name == "b");
  CHECK(entries[1].dtype == DType::kF32);
  CHECK(entries[1].shape.empty());
  CHECK(entries[2].shape == comm::Shape{0});
  CHECK(metadata.at("format") == "pt");
  CHECK(metadata.at("note") == "a\"b\xc3\xa9");
  CHECK(parse_safetensors_header("{}", 0, "x", nullptr).empty());
}

TEST_CASE("malformed JSON is refused with the byte where it went wrong",
          "[checkpoint][safetensors]") {
  CHECK_THAT(refusal(""), Catch::Contains("malformed at byte 0"));
  CHECK_THAT(
      refusal(R"({"a":{"dtype":"F32")"),
      Catch::Contains("x.safetensors") && Catch::Contains("malformed at byte"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","color":"red"}})"),
             Catch::Contains("unknown field 'color'"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[1]}})"),
             Catch::Contains("lacks dtype, shape or data_offsets"));
  CHECK_THAT(
      refusal(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})"),
      Catch::Contains("expected a non-negative integer"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})"),
             Catch::Contains("is not [begin, end]"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[99999999999999999999]}})"),
             Catch::Contains("too large"));
}

TEST_CASE(
    "a \\u escape with a character that is not hexadecimal is "
    "InvalidArgument",
    "[checkpoint][safetensors]") {
  CHECK_THAT(refusal(R"({"\uzz12":{}})"), Catch::Contains("hexadecimal"));
  CHECK_THAT(refusal(R"({"\u00)"), Catch::Contains("cut short"));
}

TEST_CASE(
    "entries whose bytes do not match their shape or the file are "
    "refused",
    "[checkpoint][safetensors]") {
  CHECK_THAT(
      refusal(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})"),
      Catch::Contains("tensor 'a' claims bytes [0, 4)"));
  CHECK_THAT(
      refusal(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[64,68]}})"),
      Catch::Contains("64 data bytes"));
  CHECK_THAT(
      refusal(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[5,4]}})"),
      Catch::Contains("claims bytes [5, 4)"));
  CHECK_THAT(
      refusal(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})"),
      Catch::Contains("has dtype F8_E4M3"));
  // Dimensions whose product wraps around to the claimed size: 2^62 * 4
  // bytes is 0 modulo 2^64.
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[4611686018427387904],)"
                     R"("data_offsets":[0,0]}})"),
             Catch::Contains("do not match its shape"));
  // A dimension beyond int64_t cannot be a shape.
  CHECK_THAT(refusal(R"({"a":{"dtype":"U8","shape":[9223372036854775808],)"
                     R"("data_offsets":[0,0]}})"),
             Catch::Contains("dimension of 'a' is too large"));
}
