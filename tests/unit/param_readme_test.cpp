// README.md's table of environment variables against the knobs libcomm
// declares: every declared COMM_* knob has a row, every COMM_* row is a
// declared knob, and the rows' types and defaults are the declarations'.
// meson passes the README's path as COMM_README_PATH. This program declares
// no knobs of its own, so list_params() holds exactly libcomm's.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "libcomm/param.h"

namespace {

struct Row {
  std::string type;
  std::string default_value;
};

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(' ') - first + 1);
}

// The cells of a Markdown table row "| a | b | c |".
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> result;
  std::size_t start = 1;
  for (std::size_t bar = line.find('|', start); bar != std::string::npos;
       bar = line.find('|', start)) {
    result.push_back(trim(line.substr(start, bar - start)));
    start = bar + 1;
  }
  return result;
}

// The COMM_* rows of the table under "## Environment variables", by name.
// Every COMM_* name in a row's first cell must be a row of its own.
std::map<std::string, Row> readme_rows() {
  std::ifstream in(COMM_README_PATH);
  REQUIRE(in);
  std::map<std::string, Row> rows;
  bool in_section = false;
  const std::regex knob_name("COMM_[A-Z0-9_]+");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) {
      in_section = line == "## Environment variables";
      continue;
    }
    if (!in_section || line.rfind("|", 0) != 0) continue;
    const std::vector<std::string> row = cells(line);
    REQUIRE(!row.empty());
    std::smatch match;
    if (!std::regex_search(row[0], match, knob_name)) continue;
    INFO(line);
    REQUIRE(row[0] == "`" + match.str() + "`");
    REQUIRE(row.size() == 4);
    CHECK(rows.count(match.str()) == 0);
    rows[match.str()] = Row{row[1], row[2]};
  }
  return rows;
}

}  // namespace

TEST_CASE("README's environment table is the declared knobs", "[param]") {
  const std::map<std::string, Row> rows = readme_rows();
  CHECK(rows.size() >= 9);
  std::map<std::string, comm::ParamInfo> declared;
  for (const comm::ParamInfo& info : comm::list_params()) {
    declared[info.name] = info;
  }
  for (const auto& [name, info] : declared) {
    INFO(name << " is declared");
    auto row = rows.find(name);
    CHECK(row != rows.end());
    if (row == rows.end()) continue;
    CHECK(row->second.type == info.type);
    CHECK(row->second.default_value == info.default_value);
  }
  for (const auto& [name, row] : rows) {
    INFO(name << " has a row in README.md");
    CHECK(declared.count(name) == 1);
  }
}
