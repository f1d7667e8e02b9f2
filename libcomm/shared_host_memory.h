// Shared host memory: host buffers that the other ranks of this host may
// map into their own address space, as NCCL's ncclMemAlloc gives buffers
// that its peers can register. A collective of the TCP backend whose
// ranks are all on one host, and whose every rank passes buffers from here,
// lets each rank read the others' buffers through such a mapping, with a
// plain copy, from smaller sizes on than it reads ordinary memory (through
// the kernel, process_vm_readv) (docs/design.md, "Shared host memory").
//
// The memory is a sealed memfd of the process, mapped once. A peer that
// reads it takes a duplicate of the descriptor (pidfd_getfd), so it needs
// the same rights over this process as the single-copy reads do, and
// keeps its mapping, which keeps the pages alive, until it learns that
// the block was freed (at its next direct read from this rank, or when
// its group is destroyed) or until it maps more blocks of this rank than
// it keeps.
//
// A child made by fork() inherits the blocks as shared mappings, so that
// what either process writes into one the other sees (ordinary memory is
// copied on write instead); they stay listed in the child, which frees
// them as the parent does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "libcomm/export.h"

namespace comm {

// Allocates `bytes` of zeroed, page-aligned host memory that ranks of this
// host may map, in whole pages (one for 0 bytes, so that each block has an
// address of its own). Throws InvalidArgument for more bytes than a file
// holds, and SystemError naming the call that failed when the kernel
// refuses (memfd_create, ftruncate or mmap: out of memory, or out of
// descriptors, since each block holds one until it is freed).
COMM_API void* allocate_shared_host(std::size_t bytes);

// Frees what allocate_shared_host returned. Throws InvalidArgument, and
// frees nothing, for any other pointer (null included), and for a block
// freed already. The caller must not free a block that a collective still
// uses, as with any buffer.
COMM_API void free_shared_host(void* data);

// One block of shared host memory, as a peer learns of it.
struct SharedHostBlock {
  // Unique to the block within its process: never reused.
  std::uint64_t serial = 0;
  // Where the block lies in its owner's address space, and its size.
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
  // The owner's descriptor of the block's memfd, and the memfd's inode,
  // by which a peer that duplicated the descriptor knows it is the block's.
  std::uint64_t inode = 0;
  std::int64_t fd = -1;
};

// The block of shared host memory that holds all of [data, data + bytes),
// or nothing where no block does (ordinary memory, or a range that runs
// past a block's end). A null `data` with 0 bytes is in no block.
COMM_API std::optional<SharedHostBlock> find_shared_host(const void* data,
                                                         std::size_t bytes);

// How many blocks this process has freed so far: a peer that maps its
// blocks drops its mappings when the count changes.
COMM_API std::uint64_t shared_host_blocks_freed();

}  // namespace comm
