// The swap store options every NVMe byte of a run goes through, from the
// run's I/O settings — a TrainerOptions or a SessionOptions, which name
// them alike — with each request on the trace's "nvme reads" / "nvme
// writes" tracks when a trace is on.
#pragma once

#include <string>

#include "engine/trace.h"
#include "io/swap_store.h"

namespace strata::engine {

template <class RunOptions>
io::SwapStoreOptions swap_store_options(const RunOptions& o) {
  io::SwapStoreOptions so;
  so.directories = o.nvme_paths;
  so.device.backend = o.io_backend;
  so.device.queue_depth = o.io_queue_depth;
  so.stripe_unit_bytes = o.io_stripe_unit_bytes;
  so.direct = o.io_direct;
  if (o.nvme_budget_bytes > 0) so.budget_bytes = o.nvme_budget_bytes;
  so.faults = o.faults;
  if (Trace* trace = o.trace; trace != nullptr && trace->enabled()) {
    // From submission until the completion was reaped: state, weight,
    // gradient and activation blobs alike.
    so.on_complete = [trace](const io::SwapRequestRecord& r) {
      trace->span(r.kind == io::IoOp::kRead ? "nvme reads" : "nvme writes",
                  std::string(r.kind == io::IoOp::kRead ? "read " : "write ") + *r.blob + (r.ok ? "" : " (failed)"),
                  trace->us(r.submitted), trace->us(r.completed), "nvme", r.bytes);
    };
  }
  return so;
}

}  // namespace strata::engine
