// What a checkpoint load refuses (issue 31): one flipped byte anywhere in
// any file of a checkpoint, a NaN or infinity planted under valid
// checksums, a record that claims another step, a missing record. Each is
// DataLoss naming the file (and the tensor), and nothing is loaded: the
// trainer goes on as it was. An unsealed record (written before records
// were sealed) loads with a warning.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/checkpoint_io.h"
#include "models/gpt/trainer.h"
#include "tests/models/gpt/trainer_runs.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

using testing::run_log;
using testing::tiny;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spill(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out) << path;
}

// Byte offsets worth flipping in a file of `size` bytes: all of a small
// one; of a safetensors file every header byte (its length, JSON and
// padding), each tensor's first and last byte and `random` more.
std::vector<uint64_t> flip_offsets(const std::string& path, uint64_t size, int random, std::mt19937_64& rng) {
  std::set<uint64_t> at;
  if (size <= 8192 || path.find(".safetensors") == std::string::npos) {
    for (uint64_t k = 0; k < size; ++k) at.insert(k);
    return {at.begin(), at.end()};
  }
  const std::string bytes = slurp(path);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  for (uint64_t k = 0; k < 8 + length; ++k) at.insert(k);
  Result<SafetensorsReader> r = SafetensorsReader::open(path);
  EXPECT_TRUE(r) << r.error().to_string();
  uint64_t begin = 8 + length;
  for (const TensorInfo& t : r->tensors()) {
    at.insert(begin);
    at.insert(begin + t.bytes() - 1);
    begin += t.bytes();
  }
  for (int k = 0; k < random; ++k) at.insert(8 + length + rng() % (size - 8 - length));
  return {at.begin(), at.end()};
}

TEST(TrainerCheckpoint, EveryFlippedByteOfEveryFileIsRefusedByName) {
  const uint64_t seed = strata::testing::test_seed(311);
  strata::testing::TempDir dir;
  const TrainerOptions o = tiny(seed);
  const std::vector<float> ref = run_log(o, 3).losses;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*tr)->step());
  const std::string root = dir.path() + "/ckpt";
  ASSERT_TRUE((*tr)->save(root).ok());
  std::mt19937_64 rng(seed);
  int flips = 0;
  for (const std::string name : {"latest", "step-2/trainer.json", "step-2/model.safetensors",
                                 "step-2/optimizer.safetensors"}) {
    const std::string path = root + "/" + name;
    const std::string leaf = std::filesystem::path(path).filename().string();
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f) << path;
    const uint64_t size = std::filesystem::file_size(path);
    int refused = 0, tried = 0;
    for (uint64_t at : flip_offsets(path, size, 300, rng)) {
      char byte = 0;
      f.seekg(static_cast<std::streamoff>(at));
      f.read(&byte, 1);
      const char flipped = static_cast<char>(byte ^ (1 << (at % 8)));
      f.seekp(static_cast<std::streamoff>(at));
      f.write(&flipped, 1);
      f.flush();
      const Status s = (*tr)->load(root);
      f.seekp(static_cast<std::streamoff>(at));
      f.write(&byte, 1);
      f.flush();
      ++flips;
      ++tried;
      refused += s.ok() ? 0 : 1;
      EXPECT_FALSE(s.ok()) << name << ": the flip of bit " << at % 8 << " at byte " << at << " was loaded";
      if (s.ok()) continue;
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << name << " byte " << at << ": " << s.to_string();
      EXPECT_NE(s.message().find(leaf), std::string::npos) << name << " byte " << at << ": " << s.to_string();
    }
    std::printf("%s: %d flips in %llu bytes, %d refused\n", name.c_str(), tried,
                static_cast<unsigned long long>(size), refused);
  }
  EXPECT_GT(flips, 1000);
  // Nothing was loaded: the trainer goes on from step 2 as if untouched;
  // the intact checkpoint loads and gives the same step again.
  EXPECT_EQ(*(*tr)->step(), ref[2]);
  ASSERT_TRUE((*tr)->load(root).ok());
  EXPECT_EQ((*tr)->steps_done(), 2);
  EXPECT_EQ(*(*tr)->step(), ref[2]);
}

// The record of step 2 (sealed again by whoever edits it), the files'
// entries and the checkpoint root: what the forging tests change.
struct Saved {
  std::string root, step_dir;
  std::unique_ptr<Trainer> trainer;
  std::vector<float> ref;
};

Saved saved_at_step_2(const strata::testing::TempDir& dir, uint64_t seed) {
  Saved s;
  const TrainerOptions o = tiny(seed);
  s.ref = run_log(o, 3).losses;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  EXPECT_TRUE(tr) << tr.error().to_string();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE((*tr)->step());
  s.root = dir.path() + "/ckpt";
  s.step_dir = s.root + "/step-2";
  EXPECT_TRUE((*tr)->save(s.root).ok());
  s.trainer = std::move(*tr);
  return s;
}

nlohmann::json record_of(const std::string& step_dir) {
  bool legacy = false;
  Result<nlohmann::json> r = open_record(step_dir + "/trainer.json", {}, &legacy);
  EXPECT_TRUE(r) << r.error().to_string();
  return r ? *r : nlohmann::json();
}

// Rewrites `file` with element `element` of `tensor` replaced by `bits`
// (the element's width), through the writer, so every checksum is valid,
// and seals the record again with the new file's size and header.
void plant(const std::string& step_dir, const std::string& file, const std::string& tensor, int64_t element,
           uint32_t bits) {
  const std::string path = step_dir + "/" + file, copy = path + ".new";
  Result<SafetensorsReader> r = SafetensorsReader::open(path);
  ASSERT_TRUE(r) << r.error().to_string();
  Result<SafetensorsWriter> w = SafetensorsWriter::create(copy, r->tensors(), r->metadata());
  ASSERT_TRUE(w) << w.error().to_string();
  bool found = false;
  for (const TensorInfo& t : r->tensors()) {
    std::vector<std::byte> bytes(t.bytes());
    ASSERT_TRUE(r->read(t.name, bytes).ok());
    if (t.name == tensor) {
      const uint64_t width = tensor_type_bytes(t.dtype);
      std::memcpy(bytes.data() + static_cast<uint64_t>(element) * width, &bits, width);
      found = true;
    }
    ASSERT_TRUE(w->append(bytes).ok());
  }
  ASSERT_TRUE(found) << tensor;
  ASSERT_TRUE(w->finish().ok());
  std::filesystem::rename(copy, path);
  nlohmann::json record = record_of(step_dir);
  record["files"][file] = {{"bytes", w->file_bytes()}, {"header_xxh3", hex64(w->header_digest())}};
  spill(step_dir + "/trainer.json", seal_record(record));
}

TEST(TrainerCheckpoint, ANanOrInfinityUnderValidChecksumsIsRefusedByName) {
  const uint64_t seed = strata::testing::test_seed(313);
  struct Case {
    std::string file, tensor;
    uint32_t bits;
  };
  const std::vector<Case> cases = {{"model.safetensors", "h.1.mlp.c_fc.weight", 0x7FC0},        // bf16 NaN
                                   {"optimizer.safetensors", "chunk-2.master", 0xFF800000u},  // fp32 -inf
                                   {"optimizer.safetensors", "chunk-0.v", 0x7F800000u}};      // fp32 +inf
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    strata::testing::TempDir dir;
    Saved s = saved_at_step_2(dir, seed);
    plant(s.step_dir, c.file, c.tensor, 5, c.bits);
    const Status loaded = s.trainer->load(s.root);
    ASSERT_FALSE(loaded.ok()) << "a non-finite " << c.tensor << " was loaded";
    EXPECT_EQ(loaded.code(), StatusCode::kDataLoss);
    EXPECT_NE(loaded.message().find(c.file + ": tensor " + c.tensor + " holds a NaN or infinity at element 5"),
              std::string::npos)
        << loaded.to_string();
    EXPECT_EQ(*s.trainer->step(), s.ref[2]) << "nothing was loaded";
  }
}

TEST(TrainerCheckpoint, ARecordClaimingAnotherStepIsRefused) {
  strata::testing::TempDir dir;
  Saved s = saved_at_step_2(dir, strata::testing::test_seed(317));
  nlohmann::json record = record_of(s.step_dir);
  record["step"] = 4;
  record["updates"] = 4;
  spill(s.step_dir + "/trainer.json", seal_record(record));  // a forged seal: the step still disagrees
  const Status loaded = s.trainer->load(s.root);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.code(), StatusCode::kDataLoss);
  EXPECT_NE(loaded.message().find("claims step 4, its directory is step 2"), std::string::npos) << loaded.to_string();
  EXPECT_EQ(*s.trainer->step(), s.ref[2]);
}

TEST(TrainerCheckpoint, AMissingRecordIsAnIncompleteCheckpointNotBadJson) {
  strata::testing::TempDir dir;
  Saved s = saved_at_step_2(dir, strata::testing::test_seed(319));
  std::filesystem::remove(s.step_dir + "/trainer.json");
  const Status loaded = s.trainer->load(s.root);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.code(), StatusCode::kDataLoss);
  EXPECT_NE(loaded.message().find("trainer.json is missing: the checkpoint is incomplete"), std::string::npos)
      << loaded.to_string();
  EXPECT_EQ(loaded.message().find("JSON"), std::string::npos) << loaded.to_string();
}

// A checkpoint written before checkpoints had checksums (a record with no
// seal, files with none) still loads, with a warning, and continues.
TEST(TrainerCheckpoint, AnUnsealedCheckpointLoadsWithAWarning) {
  strata::testing::TempDir dir;
  Saved s = saved_at_step_2(dir, strata::testing::test_seed(323));
  nlohmann::json record = record_of(s.step_dir);
  record.erase("format");
  record.erase("files");
  spill(s.step_dir + "/trainer.json", record.dump(2));
  for (const std::string file : {"model.safetensors", "optimizer.safetensors"}) {
    // The same tensors with no checksum keys: written by hand.
    const std::string path = s.step_dir + "/" + file;
    Result<SafetensorsReader> r = SafetensorsReader::open(path);
    ASSERT_TRUE(r);
    std::string bytes = slurp(path);
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
    header.erase("__metadata__");
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(text.size() >> (8 * i));
    spill(path, out + text + bytes.substr(8 + length));
    Result<SafetensorsReader> legacy = SafetensorsReader::open(path);
    ASSERT_TRUE(legacy) << legacy.error().to_string();
    EXPECT_FALSE(legacy->has_checksums());
  }
  const Status loaded = s.trainer->load(s.root);
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  EXPECT_EQ(*s.trainer->step(), s.ref[2]);
}

}  // namespace
}  // namespace strata::engine
