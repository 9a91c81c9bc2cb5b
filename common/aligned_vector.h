// std::vector whose storage starts on a 64-byte boundary (C++17 aligned
// operator new), for buffers that vector code streams with aligned,
// non-temporal stores (cpu_optim writes the low-precision weights that way).
// Storage of 2 MiB or more starts on a 2 MiB boundary and is advised as
// transparent huge pages before the vector first writes it (huge_pages.h).
//
// vector(n) and resize(n) leave the elements default-initialised:
// uninitialised, for the trivial types these buffers hold. A model-sized
// buffer is then filled by several threads (cpu_optim::Executor::zero /
// copy), its pages faulting in on them, not all on the thread that made it.
// vector(n, value), assign and resize(n, value) fill as usual.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
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
    // The unsized form: clang before 19 declares the sized one only with
    // -fsized-deallocation.
    ::operator delete (p, std::align_val_t{bulk_alignment(bytes, 64)});
  }
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const BulkAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, BulkAllocator<T>>;

}  // namespace strata
