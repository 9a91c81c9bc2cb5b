// Fuzzes the checkpoint loader. At start a tiny trainer saves a real
// checkpoint (step 1); each input replaces one of its files, chosen by the
// input's first byte, with the rest of the input:
//   0 trainer.json   1 model.safetensors   2 optimizer.safetensors   3 latest
//   4 trainer.json, sealed by the harness (what a forged seal reaches)
//   5 model.safetensors, 6 optimizer.safetensors, each bound into the
//     record by the harness (its size and header digest, the record sealed)
// Then Trainer::load must end as a Status; a refused load must leave the
// trainer able to step (nothing loaded), an accepted one too. Every other
// file is put back from the pristine copy before each input.
// STRATA_FUZZ_WRITE_SEEDS=DIR writes the pristine files as seed inputs.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/check.h"
#include "engine/checkpoint_io.h"
#include "models/gpt/trainer.h"

namespace {

using namespace strata::engine;

const char* const kFiles[] = {"step-1/trainer.json", "step-1/model.safetensors", "step-1/optimizer.safetensors",
                              "latest"};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spill(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

struct World {
  std::string root;
  std::unique_ptr<Trainer> trainer;
  std::vector<std::string> pristine;  // kFiles' contents
};

World& world() {
  static World* w = [] {
    auto* made = new World;
    const char* dir = std::getenv("STRATA_TEST_DIR");
    made->root = std::string(dir != nullptr ? dir : "/tmp") + "/strata-fuzz-checkpoint-" + std::to_string(::getpid());
    std::filesystem::remove_all(made->root);
    TrainerOptions o;
    o.model.layers = 1, o.model.hidden = 16, o.model.heads = 2, o.model.vocab = 16, o.model.max_seq = 8;
    o.batch = 2;
    o.seq = 8;
    o.pin_memory = false;
    strata::Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    STRATA_CHECK_MSG(tr.has_value(), "fuzz_checkpoint: %s", tr.error().to_string().c_str());
    STRATA_CHECK((*tr)->step().has_value());
    STRATA_CHECK((*tr)->save(made->root).ok());
    made->trainer = std::move(*tr);
    for (const char* f : kFiles) made->pristine.push_back(slurp(made->root + "/" + f));
    if (const char* seeds = std::getenv("STRATA_FUZZ_WRITE_SEEDS")) {
      for (size_t i = 0; i < made->pristine.size(); ++i) {
        spill(std::string(seeds) + "/" + std::to_string(i), std::string(1, static_cast<char>(i)) + made->pristine[i]);
      }
    }
    return made;
  }();
  return *w;
}

// Seals `record_text` (JSON) as the record, or writes it as it is when it is not JSON.
void write_sealed(const std::string& path, const std::string& record_text) {
  nlohmann::json j = nlohmann::json::parse(record_text, nullptr, false);
  spill(path, j.is_discarded() ? record_text : seal_record(j));
}

// Writes a data file and binds it into the pristine record.
void write_bound(World& w, const std::string& name, const std::string& bytes) {
  const std::string path = w.root + "/step-1/" + name;
  spill(path, bytes);
  strata::Result<SafetensorsReader> r = SafetensorsReader::open(path);
  if (!r) return;  // the record keeps the old binding: refused by it
  nlohmann::json record = nlohmann::json::parse(w.pristine[0]);
  record.erase("checksum");
  record["files"][name] = {{"bytes", r->file_bytes()}, {"header_xxh3", hex64(r->header_digest())}};
  spill(w.root + "/step-1/trainer.json", seal_record(record));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = world();
  if (size == 0) return 0;
  for (size_t i = 0; i < w.pristine.size(); ++i) spill(w.root + "/" + kFiles[i], w.pristine[i]);
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0: spill(w.root + "/" + kFiles[0], body); break;
    case 1: spill(w.root + "/" + kFiles[1], body); break;
    case 2: spill(w.root + "/" + kFiles[2], body); break;
    case 3: spill(w.root + "/" + kFiles[3], body); break;
    case 4: write_sealed(w.root + "/" + kFiles[0], body); break;
    case 5: write_bound(w, "model.safetensors", body); break;
    case 6: write_bound(w, "optimizer.safetensors", body); break;
  }
  (void)w.trainer->load(w.root);
  // Whatever the load said, the trainer steps: a refusal loaded nothing.
  strata::Result<float> loss = w.trainer->step();
  STRATA_CHECK_MSG(loss.has_value(), "a step after a load failed: %s", loss.error().to_string().c_str());
  return 0;
}
