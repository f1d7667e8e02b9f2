// A spinning thread's pause between two looks at memory another core
// writes.
#pragma once

namespace comm::detail {

// A few cycles' pause, which leaves the core to its hyperthread sibling
// and eases the spin's pressure on the memory system, without the cost of
// a system call. Does nothing on a processor without such an instruction.
inline void pause_core() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace comm::detail
