// comm::shm::kernel_copy: how fast the kernel copies between processes of
// this host (process_vm_readv, which the collectives' single-copy paths
// read peers' buffers with) against memcpy, for the choices that depend on
// it.
//
// Their ratio varies from machine to machine: process_vm_readv pins every
// page it reads, which costs little on some hosts and, under some
// hypervisors, makes the kernel's copy several times slower than memcpy
// (bench/README.md, "Single copy at two ranks"). Where it keeps up, two
// ranks do best to read each other's buffers (one copy per byte) rather
// than stream them through a ring (a copy in and a copy out), and larger
// groups from far smaller sizes; where it does not, the rings win. Only
// timing the two tells the hosts apart, so a rank times both on its own
// memory once per process, and its group agrees on the answer
// (LocalPeers::kernel_copy_keeps_up).
#pragma once

namespace comm::shm {

// Whether the kernel's copy between processes here keeps up with memcpy:
// COMM_SHM_KERNEL_COPY's word (`fast`, `slow`), or where it says `auto`,
// whether process_vm_readv of this process's own memory ran at
// kKeepsUpPercent or more of memcpy's speed, the faster of several tries
// of each, alternated, on a buffer of 256 KiB (about 100 us, timed once
// per process and kept). False where the kernel refuses the read.
// Thread-safe.
bool kernel_copy_keeps_up_here();

// The share of memcpy's speed at which the kernel's copy counts as keeping
// up: between the machines measured where the direct reads won and those
// where the rings did, far enough from both that noise does not flip the
// answer (bench/README.md, "Single copy at two ranks", has the figures).
inline constexpr int kKeepsUpPercent = 45;

}  // namespace comm::shm
