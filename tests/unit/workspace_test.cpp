// comm::Workspace: a call's buffers never overlap, like calls find the
// memory the previous one had, and what is kept between calls stays within
// the bound.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "backends/workspace.h"

using comm::Workspace;
using comm::WorkspaceBuffer;

TEST_CASE("a call's buffers do not overlap and are writable") {
  Workspace workspace(1 << 20);
  const std::vector<std::size_t> sizes = {4096, 100, 4096, 65536, 1};
  std::vector<std::uint8_t*> taken;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    taken.push_back(workspace.take(sizes[i]));
    REQUIRE(taken.back() != nullptr);
    std::memset(taken.back(), static_cast<int>(i + 1), sizes[i]);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t b = 0; b < sizes[i]; ++b) {
      REQUIRE(taken[i][b] == static_cast<std::uint8_t>(i + 1));
    }
  }
  CHECK(workspace.take(0) == nullptr);
}

TEST_CASE("like calls take the memory the previous call had") {
  Workspace workspace(1 << 20);
  auto call = [&] {
    std::vector<std::uint8_t*> taken = {workspace.take(256 << 10),
                                        workspace.take(768 << 10)};
    workspace.release();
    return taken;
  };
  const auto first = call();
  const std::size_t held = workspace.held_bytes();
  CHECK(held == (1 << 20));
  for (int i = 0; i < 5; ++i) {
    CHECK(call() == first);
    CHECK(workspace.held_bytes() == held);
  }
}

TEST_CASE("a smaller call reuses a larger block without growing") {
  Workspace workspace(1 << 20);
  workspace.take(512 << 10);
  workspace.release();
  workspace.take(1000);
  workspace.release();
  CHECK(workspace.held_bytes() == (512 << 10));
}

TEST_CASE("what a call takes beyond the bound is freed as it ends") {
  Workspace workspace(1 << 20);
  workspace.take(768 << 10);
  workspace.take(512 << 10);
  workspace.take(200 << 10);
  CHECK(workspace.held_bytes() == (1480 << 10));
  workspace.release();
  // The largest blocks that fit together: 768 KiB and 200 KiB.
  CHECK(workspace.held_bytes() == (968 << 10));
  workspace.take(4 << 20);
  workspace.release();
  CHECK(workspace.held_bytes() == (968 << 10));

  Workspace keeps_nothing(0);
  keeps_nothing.take(4096);
  keeps_nothing.release();
  CHECK(keeps_nothing.held_bytes() == 0);
}

TEST_CASE("a buffer without a workspace owns its memory") {
  const WorkspaceBuffer owned(nullptr, 4096);
  REQUIRE(owned.get() != nullptr);
  std::memset(owned.get(), 7, 4096);
  CHECK(WorkspaceBuffer(nullptr, 0).get() == nullptr);

  Workspace workspace(1 << 20);
  const WorkspaceBuffer taken(&workspace, 4096);
  CHECK(workspace.held_bytes() == 4096);
  CHECK(taken.get() != nullptr);
}
