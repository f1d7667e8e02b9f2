#include "backends/workspace.h"

#include <algorithm>
#include <utility>

namespace comm {

std::uint8_t* Workspace::take(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // The smallest free block that holds `bytes`: calls of one shape take
  // the same sizes in the same order, so each finds the block it had.
  std::size_t best = blocks_.size();
  for (std::size_t i = taken_; i < blocks_.size(); ++i) {
    if (blocks_[i].bytes >= bytes &&
        (best == blocks_.size() || blocks_[i].bytes < blocks_[best].bytes)) {
      best = i;
    }
  }
  if (best == blocks_.size()) {
    blocks_.push_back(
        {std::make_unique_for_overwrite<std::uint8_t[]>(bytes), bytes});
  }
  std::swap(blocks_[best], blocks_[taken_]);
  return blocks_[taken_++].data.get();
}

void Workspace::release() {
  taken_ = 0;
  if (held_bytes() <= retained_bytes_) return;
  std::sort(blocks_.begin(), blocks_.end(),
            [](const Block& a, const Block& b) { return a.bytes > b.bytes; });
  std::size_t kept = 0;
  std::erase_if(blocks_, [&](const Block& block) {
    if (kept + block.bytes > retained_bytes_) return true;
    kept += block.bytes;
    return false;
  });
}

std::size_t Workspace::held_bytes() const {
  std::size_t held = 0;
  for (const Block& block : blocks_) held += block.bytes;
  return held;
}

WorkspaceBuffer::WorkspaceBuffer(Workspace* workspace, std::size_t bytes) {
  if (workspace != nullptr) {
    data_ = workspace->take(bytes);
  } else if (bytes > 0) {
    owned_ = std::make_unique_for_overwrite<std::uint8_t[]>(bytes);
    data_ = owned_.get();
  }
}

}  // namespace comm
