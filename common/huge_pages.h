// Transparent huge pages for the big host buffers (optimizer states, staged
// NVMe pieces — unless cudaHostAlloc made them —, weights and gradients). A
// memory-bound loop over several streams of 4 KiB pages spends part of its
// time in page walks; the CPU optimizer runs 10-17% faster from memory over
// 2 MiB pages (bench/results/cpu_optim_revisions.md, "Seventh revision: 2 MiB pages"). Buffers
// of at least kHugePageBytes are placed on 2 MiB boundaries and advised
// MADV_HUGEPAGE before their first touch. It is a hint: where THP is off
// ("never") the kernel keeps 4 KiB pages, and STRATA_HUGE_PAGES=0 in the
// environment turns the advice off.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

inline constexpr uint64_t kHugePageBytes = 2ull << 20;

// Whether buffers are advised (read once from STRATA_HUGE_PAGES; default on).
bool huge_pages_enabled();

// The alignment for a buffer of `bytes`: kHugePageBytes when advice is on
// and the buffer spans at least one huge page, else `base`.
uint64_t bulk_alignment(uint64_t bytes, uint64_t base);

// Advises [data, data + bytes) as huge pages when advice is on, `data` is
// 2 MiB-aligned and the range spans at least one huge page. Call before the
// memory is first touched. Returns whether the advice was given.
bool advise_huge_pages(void* data, uint64_t bytes);

}  // namespace strata
