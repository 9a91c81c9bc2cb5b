// strata-iobench: sequential O_DIRECT read and write bandwidth of the io/
// layer (io_uring and POSIX backends) at several block sizes and queue
// depths, optionally next to fio (io_uring engine, O_DIRECT, same file, block
// size and depth) run in the same invocation. Prints a table, one row as each
// measurement finishes, and ends with one JSON line holding every figure.
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/units.h"
#include "io/buffer.h"
#include "io/device_factory.h"
#include "io/file.h"
#include "io/io_queue.h"

namespace strata::bench {
namespace {

using io::Backend;
using io::IoOp;

struct Row {
  std::string backend;
  IoOp op;
  uint64_t block_bytes;
  uint32_t qd;
  double gbps = 0;
  double cpu_cores = 0;
  double fio_gbps = 0;
};

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// Streams the whole file once, keeping `qd` requests of `block` bytes in flight.
Result<Row> measure(Backend backend, IoOp op, const io::File& file, uint64_t size, uint64_t block, uint32_t qd) {
  io::DeviceOptions options;
  options.backend = backend;
  options.queue_depth = qd;
  options.posix_threads = qd;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<io::BlockDevice> device, io::make_block_device(options));
  STRATA_ASSIGN_OR_RETURN(io::Buffer buffers, io::allocate_aligned(uint64_t{qd} * block, file.alignment()));
  if (op == IoOp::kWrite) {
    for (uint64_t i = 0; i < buffers.capacity_bytes(); ++i) buffers.data()[i] = std::byte(i * 131 + 7);
  }
  STRATA_RETURN_IF_ERROR(device->register_buffer(buffers.span()));
  io::IoQueue queue(*device);
  STRATA_ASSIGN_OR_RETURN(int32_t slot, queue.attach(file.fd(), file.path(), file.alignment()));
  uint64_t blocks = size / block;
  uint64_t next = 0, done = 0;
  std::vector<io::IoResult> results;
  double cpu0 = cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  auto issue = [&](uint64_t buffer_index) {
    io::IoRequest r{op, slot, next * block, buffers.data() + buffer_index * block, block, buffer_index};
    ++next;
    return queue.submit(r);
  };
  for (uint32_t i = 0; i < qd && next < blocks; ++i) STRATA_RETURN_IF_ERROR(issue(i));
  while (done < blocks) {
    results.clear();
    STRATA_ASSIGN_OR_RETURN(size_t n, queue.wait(1, results));
    for (size_t i = 0; i < n; ++i) {
      STRATA_RETURN_IF_ERROR(std::move(results[i].status));
      ++done;
      if (next < blocks) STRATA_RETURN_IF_ERROR(issue(results[i].tag));
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = cpu_seconds() - cpu0;
  STRATA_RETURN_IF_ERROR(queue.detach(slot));
  Row row{std::string(device->name()), op, block, qd};
  row.gbps = static_cast<double>(blocks * block) / seconds / 1e9;
  row.cpu_cores = cpu / seconds;
  return row;
}

// Runs fio with the same workload; returns GB/s or an error if fio is missing or fails.
Result<double> run_fio(const std::string& path, IoOp op, uint64_t size, uint64_t block, uint32_t qd) {
  std::string cmd = "fio --name=strata --filename=" + path + " --rw=" + (op == IoOp::kRead ? "read" : "write") +
                    " --bs=" + std::to_string(block) + " --iodepth=" + std::to_string(qd) +
                    " --ioengine=io_uring --direct=1 --size=" + std::to_string(size) +
                    " --output-format=json 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return unavailable("cannot start fio");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int rc = ::pclose(pipe);
  if (rc != 0) return unavailable("fio failed (exit " + std::to_string(rc) + "); is it installed (scripts/setup)?");
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("jobs")) return internal_error("cannot parse fio's JSON output");
  const auto& job = j["jobs"][0][op == IoOp::kRead ? "read" : "write"];
  return job["bw_bytes"].get<double>() / 1e9;
}

std::string fs_type(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%lx", static_cast<unsigned long>(fs.f_type));
  switch (fs.f_type) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    default: return buf;
  }
}


int run(int argc, char** argv) {
  CLI::App app{"strata-iobench: sequential O_DIRECT bandwidth of strata's io layer"};
  std::string dir = "/tmp";
  std::string size_text = "2GiB";
  std::vector<std::string> block_texts = {"128KiB", "1MiB", "8MiB"};
  std::vector<uint32_t> depths = {1, 8, 32};
  std::vector<std::string> backends = {"uring", "posix"};
  bool compare_fio = false;
  uint32_t repeat = 2;
  app.add_option("--dir", dir, "directory for the test file (on the NVMe drive to measure)")->capture_default_str();
  app.add_option("--size", size_text, "file size (e.g. 4GiB)")->capture_default_str();
  app.add_option("--blocks", block_texts, "block sizes")->capture_default_str();
  app.add_option("--qd", depths, "queue depths")->capture_default_str();
  app.add_option("--backends", backends, "uring, posix")->capture_default_str();
  app.add_flag("--compare-fio", compare_fio, "also run fio with the same workload and print strata/fio ratios");
  app.add_option("--repeat", repeat, "runs of each measurement (best is kept; fio and strata alternate order)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  CLI11_PARSE(app, argc, argv);

  uint64_t size = 0;
  if (!parse_bytes(size_text, &size) || size == 0) {
    std::fprintf(stderr, "strata-iobench: --size '%s' is not a byte count (e.g. 2GiB)\n", size_text.c_str());
    return 2;
  }
  std::vector<uint64_t> blocks;
  for (const std::string& t : block_texts) {
    uint64_t b = 0;
    if (!parse_bytes(t, &b) || b == 0 || b % 4096 != 0 || b > io::kMaxRequestBytes) {
      std::fprintf(stderr, "strata-iobench: block size '%s' must be a multiple of 4 KiB up to 1 GiB\n", t.c_str());
      return 2;
    }
    if (b > size) {
      std::fprintf(stderr, "strata-iobench: block size %s exceeds --size %s\n", t.c_str(), size_text.c_str());
      return 2;
    }
    blocks.push_back(b);
  }
  std::vector<Backend> chosen;
  for (const std::string& b : backends) {
    Result<Backend> parsed = io::parse_backend(b);
    if (!parsed || *parsed == Backend::kAuto) {
      std::fprintf(stderr, "strata-iobench: --backends takes uring and/or posix, not '%s'\n", b.c_str());
      return 2;
    }
    chosen.push_back(*parsed);
  }

  std::string path = dir + "/strata-iobench." + std::to_string(::getpid()) + ".bin";
  Result<io::File> file = io::File::open(path, io::FileOptions{});
  if (!file) {
    std::fprintf(stderr, "strata-iobench: %s\n", file.error().to_string().c_str());
    return 1;
  }
  uint64_t rounded = round_down(size, blocks.empty() ? 4096 : *std::max_element(blocks.begin(), blocks.end()));
  std::printf("strata-iobench: %s file %s on %s, %zu configurations%s\n", format_bytes(rounded).c_str(),
              path.c_str(), fs_type(dir).c_str(), chosen.size() * blocks.size() * depths.size() * 2,
              compare_fio ? " (+ the same with fio)" : "");
  if (Status s = file->allocate(0, rounded); !s.ok()) {
    std::fprintf(stderr, "strata-iobench: %s\n", s.to_string().c_str());
    ::unlink(path.c_str());
    return 1;
  }
  std::printf("%-8s %-5s %8s %4s %8s %6s %9s %7s\n", "backend", "op", "block", "qd", "GB/s", "cores", "fio GB/s",
              "ratio");
  std::vector<Row> rows;
  int exit_code = 0;
  auto fio_once = [&](IoOp op, uint64_t block, uint32_t qd) -> double {
    if (!compare_fio) return 0;
    Result<double> f = run_fio(path, op, round_down(rounded, block), block, qd);
    if (f) return *f;
    std::fprintf(stderr, "strata-iobench: %s; continuing without fio\n", f.error().to_string().c_str());
    exit_code = 1;
    compare_fio = false;
    return 0;
  };
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    for (uint64_t block : blocks) {
      for (uint32_t qd : depths) {
        // Best of `repeat`, alternating which of fio and strata goes first so
        // neither profits from warming the drive or host cache for the other.
        double fio = 0;
        std::vector<double> best(chosen.size(), 0), best_cpu(chosen.size(), 0);
        std::vector<std::string> names(chosen.size());
        for (uint32_t rep = 0; rep < repeat; ++rep) {
          bool fio_first = rep % 2 == 0;
          if (compare_fio && fio_first) fio = std::max(fio, fio_once(op, block, qd));
          for (size_t b = 0; b < chosen.size(); ++b) {
            Result<Row> row = measure(chosen[b], op, *file, round_down(rounded, block), block, qd);
            if (!row) {
              std::fprintf(stderr, "strata-iobench: %s\n", row.error().to_string().c_str());
              exit_code = 1;
              continue;
            }
            names[b] = row->backend;
            if (row->gbps > best[b]) {
              best[b] = row->gbps;
              best_cpu[b] = row->cpu_cores;
            }
          }
          if (compare_fio && !fio_first) fio = std::max(fio, fio_once(op, block, qd));
        }
        for (size_t b = 0; b < chosen.size(); ++b) {
          if (best[b] == 0) continue;
          Row row{names[b], op, block, qd, best[b], best_cpu[b], fio};
          std::printf("%-8s %-5s %8s %4u %8.3f %6.2f", row.backend.c_str(), std::string(io::io_op_name(op)).c_str(),
                      format_bytes(block).c_str(), qd, row.gbps, row.cpu_cores);
          if (fio > 0) {
            std::printf(" %9.3f %7.3f\n", fio, row.gbps / fio);
          } else {
            std::printf(" %9s %7s\n", "-", "-");
          }
          std::fflush(stdout);
          rows.push_back(row);
        }
      }
    }
  }
  ::unlink(path.c_str());

  nlohmann::json j;
  j["bench"] = "io";
  j["system"] = system_info();
  j["system"]["filesystem"] = fs_type(dir);
  j["file_bytes"] = rounded;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json o = {{"backend", r.backend}, {"op", std::string(io::io_op_name(r.op))},
                        {"block_bytes", r.block_bytes}, {"qd", r.qd}, {"gbps", r.gbps}, {"cpu_cores", r.cpu_cores}};
    if (r.fio_gbps > 0) {
      o["fio_gbps"] = r.fio_gbps;
      o["ratio"] = r.gbps / r.fio_gbps;
    }
    j["rows"].push_back(o);
  }
  std::printf("%s\n", j.dump().c_str());
  return exit_code;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
