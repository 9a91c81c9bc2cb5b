// std::vector whose storage starts on a 64-byte boundary (C++17 aligned
// operator new), for buffers that vector code streams with aligned,
// non-temporal stores (cpu_optim writes the low-precision weights that way).
// Storage of 2 MiB or more starts on a 2 MiB boundary and is advised as
// transparent huge pages before the vector first writes it (huge_pages.h).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "common/huge_pages.h"

namespace strata {

template <class T>
struct BulkAllocator {
  using value_type = T;
  BulkAllocator() = default;
  template <class U>
  BulkAllocator(const BulkAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    void* p = ::operator new (bytes, std::align_val_t{bulk_alignment(bytes, 64)});
    advise_huge_pages(p, bytes);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    ::operator delete (p, bytes, std::align_val_t{bulk_alignment(bytes, 64)});
  }
  template <class U>
  bool operator==(const BulkAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, BulkAllocator<T>>;

}  // namespace strata
