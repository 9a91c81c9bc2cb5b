#include "engine/pinned_arena.h"

#include <utility>

#include "common/units.h"
#include "cpu_optim/executor.h"

namespace strata::engine {

PinnedArena::Lease::Lease(Lease&& other) noexcept { *this = std::move(other); }

PinnedArena::Lease& PinnedArena::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    reset();
    arena_ = std::exchange(other.arena_, nullptr);
    index_ = other.index_;
  }
  return *this;
}

PinnedArena::Lease::~Lease() { reset(); }

void PinnedArena::Lease::reset() {
  if (arena_ != nullptr) arena_->release(index_);
  arena_ = nullptr;
}

io::IoBuffer PinnedArena::Lease::buffer() const {
  STRATA_CHECK(arena_ != nullptr);
  return {arena_->memory_.data() + static_cast<uint64_t>(index_) * arena_->buffer_bytes_, arena_->buffer_bytes_};
}

Result<std::unique_ptr<PinnedArena>> PinnedArena::create(std::string name, uint64_t buffer_bytes, uint32_t buffers,
                                                         io::BufferAllocator& allocator,
                                                         cpu_optim::Executor* first_touch) {
  if (buffer_bytes == 0 || buffers == 0) {
    return invalid_argument("pinned arena '" + name + "': buffer size and count must be > 0");
  }
  std::unique_ptr<PinnedArena> arena(new PinnedArena());
  arena->name_ = std::move(name);
  arena->buffer_bytes_ = round_up(buffer_bytes, 4096);
  const uint64_t total = arena->buffer_bytes_ * buffers;
  Result<io::Buffer> memory = allocator.allocate(total, 4096);
  if (!memory) {
    return std::move(memory).error().with_context("pinned arena '" + arena->name_ + "' (" + std::to_string(buffers) +
                                                  " x " + format_bytes(arena->buffer_bytes_) + ")");
  }
  arena->memory_ = std::move(memory).value();
  if (first_touch != nullptr) STRATA_RETURN_IF_ERROR(first_touch->first_touch(arena->memory_.data(), total));
  arena->in_use_.assign(buffers, false);
  for (uint32_t i = buffers; i-- > 0;) arena->free_.push_back(i);
  return arena;
}

PinnedArena::~PinnedArena() {
  STRATA_CHECK_MSG(free_.size() == in_use_.size(), "pinned arena '%s' destroyed with %zu buffers leased",
                   name_.c_str(), in_use_.size() - free_.size());
}

Result<PinnedArena::Lease> PinnedArena::acquire(std::string_view what) {
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    return resource_exhausted("pinned arena '" + name_ + "': all " + std::to_string(in_use_.size()) + " buffers of " +
                              format_bytes(buffer_bytes_) + " are in use (" + std::string(what) +
                              " needs one); the plan's in-flight limit was exceeded");
  }
  uint32_t index = free_.back();
  free_.pop_back();
  in_use_[index] = true;
  high_water_ = std::max(high_water_, static_cast<uint32_t>(in_use_.size() - free_.size()));
  return Lease(this, index);
}

void PinnedArena::release(uint32_t index) {
  std::lock_guard lock(mu_);
  STRATA_CHECK_MSG(index < in_use_.size() && in_use_[index], "pinned arena '%s': buffer %u released twice",
                   name_.c_str(), index);
  in_use_[index] = false;
  free_.push_back(index);
}

uint32_t PinnedArena::in_use() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(in_use_.size() - free_.size());
}

uint32_t PinnedArena::high_water() const {
  std::lock_guard lock(mu_);
  return high_water_;
}

}  // namespace strata::engine
