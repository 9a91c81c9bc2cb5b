#include "engine/checkpoint_io.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "models/gpt/gpt_config.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

std::vector<TensorInfo> gpt_tensors(const gpt::GptConfig& c) {
  std::vector<TensorInfo> out;
  for (const auto& chunk : gpt::model_layout(c)) {
    for (const auto& t : chunk.tensors) out.push_back({t.name, TensorType::kF32, t.shape});
  }
  return out;
}

// Writes every tensor as floats whose value is (tensor index * 1000 + element),
// in pieces of `piece` bytes.
Status write_model(const std::string& path, const std::vector<TensorInfo>& tensors, size_t piece) {
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(path, tensors, {{"step", "10"}}));
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<float> v(tensors[i].bytes() / 4);
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 1000 + k);
    auto bytes = std::as_bytes(std::span(v));
    for (size_t off = 0; off < bytes.size(); off += piece) {
      STRATA_RETURN_IF_ERROR(w.append(bytes.subspan(off, std::min(piece, bytes.size() - off))));
    }
  }
  return w.finish();
}

TEST(Safetensors, RoundTripWithGpt2NamesStreamedInPieces) {
  strata::testing::TempDir dir;
  gpt::GptConfig c;
  c.layers = 2, c.hidden = 16, c.heads = 2, c.vocab = 37, c.max_seq = 9;
  auto tensors = gpt_tensors(c);
  std::string path = dir.path() + "/model.safetensors";
  ASSERT_TRUE(write_model(path, tensors, 77).ok());
  // The layout is the format's: 8-byte little-endian length, JSON, data.
  std::ifstream in(path, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string text(len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(len));
  nlohmann::json header = nlohmann::json::parse(text);
  EXPECT_EQ(header["h.1.attn.c_attn.weight"]["shape"], (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(header["wte.weight"]["dtype"], "F32");
  EXPECT_EQ(header["__metadata__"]["step"], "10");
  EXPECT_EQ((8 + len) % 8, 0u);
  Result<SafetensorsReader> r = SafetensorsReader::open(path);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->tensors().size(), tensors.size());
  EXPECT_EQ(r->metadata().at("step"), "10");
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<float> v(tensors[i].bytes() / 4);
    ASSERT_TRUE(r->read(tensors[i].name, std::as_writable_bytes(std::span(v))).ok());
    for (size_t k = 0; k < v.size(); ++k) ASSERT_EQ(v[k], static_cast<float>(i * 1000 + k)) << tensors[i].name;
  }
  float part[3];
  ASSERT_TRUE(r->read("ln_f.bias", std::as_writable_bytes(std::span(part)), 8).ok());  // from element 2
  EXPECT_EQ(part[0], static_cast<float>((tensors.size() - 1) * 1000 + 2));
  EXPECT_EQ(r->read("nope", std::as_writable_bytes(std::span(part))).code(), StatusCode::kNotFound);
}

// Bytes placed by offset, tensors and pieces out of order (as a checkpoint
// streams optimizer-state pieces into each chunk's tensors): the same file
// as appending them in order.
TEST(Safetensors, WritesAtOffsetsMakeTheSameFileAsAppends) {
  strata::testing::TempDir dir;
  gpt::GptConfig c;
  c.layers = 2, c.hidden = 16, c.heads = 2, c.vocab = 37, c.max_seq = 9;
  const std::vector<TensorInfo> tensors = gpt_tensors(c);
  ASSERT_TRUE(write_model(dir.path() + "/appended.safetensors", tensors, 77).ok());
  Result<SafetensorsWriter> w = SafetensorsWriter::create(dir.path() + "/placed.safetensors", tensors, {{"step", "10"}});
  ASSERT_TRUE(w);
  for (size_t i = tensors.size(); i-- > 0;) {
    std::vector<float> v(tensors[i].bytes() / 4);
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 1000 + k);
    const auto bytes = std::as_bytes(std::span(v));
    const size_t half = (bytes.size() / 2) & ~size_t{3};
    ASSERT_TRUE(w->write_at(i, half, bytes.subspan(half)).ok());  // the second half first
    if (i == 0) {
      EXPECT_EQ(w->finish().code(), StatusCode::kFailedPrecondition) << "the first half is missing";
    }
    ASSERT_TRUE(w->write_at(i, 0, bytes.first(half)).ok());
  }
  ASSERT_TRUE(w->finish().ok());
  auto slurp = [&](const std::string& name) {
    std::ifstream in(dir.path() + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(slurp("placed.safetensors"), slurp("appended.safetensors"));
  Result<SafetensorsWriter> bad = SafetensorsWriter::create(dir.path() + "/bad.safetensors", tensors);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->write_at(0, tensors[0].bytes() - 4, std::vector<std::byte>(8)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad->write_at(tensors.size(), 0, std::vector<std::byte>(4)).code(), StatusCode::kInvalidArgument);
}

// Big writes (and reads) go to the disk with O_DIRECT, their partial
// blocks through the page cache: tensors of odd sizes (so their boundaries fall anywhere in a
// block), written in random pieces in a random order, give exactly the
// bytes an in-memory copy of the file holds — on the test directory's
// filesystem (O_DIRECT: some bytes direct) and on tmpfs (O_DIRECT or not,
// as the kernel has it).
TEST(Safetensors, DirectAndPageCacheWritesMakeTheSameFile) {
  strata::testing::TempDir disk;
  std::vector<std::string> dirs = {disk.path()};
  std::unique_ptr<strata::testing::TempDir> shm;
  if (std::filesystem::is_directory("/dev/shm")) {
    shm = std::make_unique<strata::testing::TempDir>("/dev/shm");
    dirs.push_back(shm->path());
  }
  std::mt19937_64 rng(strata::testing::test_seed(181));
  std::vector<TensorInfo> tensors;
  for (int i = 0; i < 12; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % (i % 3 == 0 ? 7 : 400000));  // some tiny, most big
    tensors.push_back({"t" + std::to_string(i), i % 2 ? TensorType::kBF16 : TensorType::kF32, {n}});
  }
  for (const std::string& d : dirs) {
    SCOPED_TRACE(d);
    const std::string path = d + "/mixed.safetensors";
    Result<SafetensorsWriter> w = SafetensorsWriter::create(path, tensors);
    ASSERT_TRUE(w) << w.error().to_string();
    std::vector<std::vector<std::byte>> data;
    struct Piece {
      size_t tensor;
      uint64_t offset, bytes;
    };
    std::vector<Piece> pieces;
    for (size_t i = 0; i < tensors.size(); ++i) {
      data.emplace_back(tensors[i].bytes());
      for (auto& b : data.back()) b = static_cast<std::byte>(rng());
      for (uint64_t at = 0; at < tensors[i].bytes();) {
        const uint64_t n = std::min<uint64_t>(tensors[i].bytes() - at, 1 + rng() % 300000);
        pieces.push_back({i, at, n});
        at += n;
      }
    }
    std::shuffle(pieces.begin(), pieces.end(), rng);
    for (const Piece& p : pieces) {
      ASSERT_TRUE(w->write_at(p.tensor, p.offset, std::span(data[p.tensor]).subspan(p.offset, p.bytes)).ok());
    }
    const uint64_t direct = w->direct_bytes();
    ASSERT_TRUE(w->finish().ok());
    if (d == disk.path()) {
      EXPECT_GT(direct, 0u) << "no write went to the disk directly";
    }
    Result<SafetensorsReader> r = SafetensorsReader::open(path);
    ASSERT_TRUE(r) << r.error().to_string();
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<std::byte> back(tensors[i].bytes());
      ASSERT_TRUE(r->read(tensors[i].name, back).ok());
      EXPECT_TRUE(back == data[i]) << tensors[i].name;
    }
    // Reads of random parts, direct and through the page cache as the
    // writes were.
    for (const Piece& p : pieces) {
      std::vector<std::byte> part(p.bytes);
      ASSERT_TRUE(r->read(tensors[p.tensor].name, part, p.offset).ok());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), data[p.tensor].begin() + static_cast<ptrdiff_t>(p.offset)))
          << tensors[p.tensor].name << " at " << p.offset;
    }
    if (d == disk.path()) {
      EXPECT_GT(r->direct_bytes(), 0u) << "no read came from the disk directly";
    }
  }
}

TEST(Safetensors, WrongAmountsAndTruncationAreErrors) {
  strata::testing::TempDir dir;
  std::vector<TensorInfo> t = {{"a", TensorType::kBF16, {3, 2}}, {"b", TensorType::kF32, {5}}};
  Result<SafetensorsWriter> w = SafetensorsWriter::create(dir.path() + "/x.safetensors", t);
  ASSERT_TRUE(w);
  std::vector<std::byte> twelve(12), too_much(21);
  ASSERT_TRUE(w->append(twelve).ok());
  EXPECT_EQ(w->finish().code(), StatusCode::kFailedPrecondition);  // "b" missing
  Result<SafetensorsWriter> w2 = SafetensorsWriter::create(dir.path() + "/y.safetensors", t);
  EXPECT_EQ(w2->append(std::vector<std::byte>(33)).code(), StatusCode::kInvalidArgument);
  // A file cut short is DataLoss, not garbage.
  ASSERT_TRUE(write_model(dir.path() + "/z.safetensors", {{"w", TensorType::kF32, {100}}}, 64).ok());
  std::filesystem::resize_file(dir.path() + "/z.safetensors", std::filesystem::file_size(dir.path() + "/z.safetensors") - 4);
  EXPECT_EQ(SafetensorsReader::open(dir.path() + "/z.safetensors").error().code(), StatusCode::kDataLoss);
  EXPECT_EQ(SafetensorsReader::open(dir.path() + "/missing").error().code(), StatusCode::kNotFound);
}

// Issue 31: one damaged header byte in a dtype gave "safetensors dtype  is
// not supported" naming no file. Now: DataLoss naming the file, the tensor,
// what the entry says and what is allowed. A tensor's bytes that no longer
// match its checksum are named with their range; a reader of an intact file
// verifies it.
TEST(Safetensors, ADamagedEntryOrTensorNamesTheFileAndTheTensor) {
  strata::testing::TempDir dir;
  const std::string path = dir.path() + "/d.safetensors";
  ASSERT_TRUE(write_model(path, {{"w", TensorType::kF32, {100}}, {"b", TensorType::kF32, {7}}}, 64).ok());
  Result<SafetensorsReader> intact = SafetensorsReader::open(path);
  ASSERT_TRUE(intact) << intact.error().to_string();
  EXPECT_TRUE(intact->has_checksums());
  EXPECT_TRUE(intact->verify(nullptr).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto damaged = [&](size_t at, char to) {
    std::string copy = bytes;
    copy[at] = to;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << copy;
  };
  const size_t dtype = bytes.find("\"F32\"", bytes.find("\"w\""));
  ASSERT_NE(dtype, std::string::npos);
  damaged(dtype + 2, 'X');  // "FX2"
  Result<SafetensorsReader> r = SafetensorsReader::open(path);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kDataLoss);
  const std::string m(r.error().message());
  EXPECT_NE(m.find("safetensors " + path + ": tensor w: entry"), std::string::npos) << m;
  EXPECT_NE(m.find("F32, BF16, F16, U8"), std::string::npos) << m;
  // A data byte of tensor b: its checksum, its byte range.
  damaged(bytes.size() - 3, static_cast<char>(bytes[bytes.size() - 3] ^ 0x10));
  Result<SafetensorsReader> data = SafetensorsReader::open(path);
  ASSERT_TRUE(data) << "the header is intact";
  const Status v = data->verify(nullptr);
  EXPECT_EQ(v.code(), StatusCode::kDataLoss);
  EXPECT_NE(v.message().find("tensor b (file bytes " + std::to_string(bytes.size() - 28) + ".." +
                             std::to_string(bytes.size()) + ") does not match its checksum"),
            std::string::npos)
      << v.to_string();
}

TEST(CheckpointDir, CommitIsAtomicAndAKilledWriterLeavesThePreviousOne) {
  strata::testing::TempDir dir;
  CheckpointDir ckpt(dir.path() + "/ckpt");
  EXPECT_EQ(ckpt.latest_step().error().code(), StatusCode::kNotFound);
  std::vector<TensorInfo> model = {{"w", TensorType::kF32, {1 << 16}}};
  Result<std::string> tmp = ckpt.begin(10);
  ASSERT_TRUE(tmp);
  ASSERT_TRUE(write_model(*tmp + "/model.safetensors", model, 4096).ok());
  ASSERT_TRUE(ckpt.commit(10).ok());
  ASSERT_EQ(*ckpt.latest_step(), 10);

  // A child starts checkpoint 20, writes part of it, says so through a
  // pipe and waits on another that is never written: it is killed
  // mid-write, whatever the machine's speed (no sleep to outlast).
  int written[2], never[2];
  ASSERT_EQ(::pipe(written), 0);
  ASSERT_EQ(::pipe(never), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<std::string> t20 = ckpt.begin(20);
    if (!t20) ::_exit(2);
    std::vector<TensorInfo> big = {{"w", TensorType::kF32, {1 << 26}}};
    Result<SafetensorsWriter> w = SafetensorsWriter::create(*t20 + "/model.safetensors", big);
    if (!w) ::_exit(3);
    std::vector<std::byte> piece(1 << 16);
    for (int k = 0; k < 16; ++k) {
      if (!w->append(piece).ok()) ::_exit(4);
    }
    const char part = 'p';
    if (::write(written[1], &part, 1) != 1) ::_exit(5);
    char c;
    while (::read(never[0], &c, 1) != 0) {
    }
    ::_exit(6);  // not reached: killed first
  }
  char part = 0;
  ASSERT_EQ(::read(written[0], &part, 1), 1) << "the child failed before writing part of checkpoint 20";
  ASSERT_EQ(part, 'p');
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  for (int fd : {written[0], written[1], never[0], never[1]}) ::close(fd);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ckpt/step-20.tmp"));  // the half-written one
  Result<CheckpointDir::Entry> latest = ckpt.latest();
  ASSERT_TRUE(latest) << latest.error().to_string();
  EXPECT_EQ(latest->step, 10);
  Result<SafetensorsReader> r = SafetensorsReader::open(latest->path + "/model.safetensors");
  ASSERT_TRUE(r) << r.error().to_string();
  std::vector<float> v(1 << 16);
  ASSERT_TRUE(r->read("w", std::as_writable_bytes(std::span(v))).ok());
  EXPECT_EQ(v[12345], 12345.0f);
  // The next attempt at step 20 starts clean and commits.
  Result<std::string> again = ckpt.begin(20);
  ASSERT_TRUE(again);
  EXPECT_TRUE(std::filesystem::is_empty(*again));
  ASSERT_TRUE(write_model(*again + "/model.safetensors", model, 4096).ok());
  ASSERT_TRUE(ckpt.commit(20).ok());
  EXPECT_EQ(*ckpt.latest_step(), 20);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ckpt/step-10"));  // older checkpoints are kept
  // Saving step 20 again never touches the directory `latest` names: the new
  // one gets a fresh name, and `latest` moves only once it is complete.
  Result<std::string> resave = ckpt.begin(20);
  ASSERT_TRUE(resave);
  EXPECT_NE(resave->find("step-20.r1.tmp"), std::string::npos) << *resave;
  EXPECT_EQ(ckpt.latest()->path, dir.path() + "/ckpt/step-20");
  ASSERT_TRUE(write_model(*resave + "/model.safetensors", model, 4096).ok());
  ASSERT_TRUE(ckpt.commit(20).ok());
  EXPECT_EQ(ckpt.latest()->path, dir.path() + "/ckpt/step-20.r1");
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ckpt/step-20"));
}

// A root has one writer: an attempt that does not commit is removed when
// its CheckpointDir goes, and begin() removes whatever .tmp a killed writer
// left, of any step (a failed checkpoint must not keep the space the next
// one needs).
TEST(CheckpointDir, UnfinishedAttemptsAreRemoved) {
  strata::testing::TempDir dir;
  const std::string root = dir.path() + "/ckpt";
  std::vector<TensorInfo> model = {{"w", TensorType::kF32, {1 << 12}}};
  {
    CheckpointDir ckpt(root);
    Result<std::string> tmp = ckpt.begin(3);
    ASSERT_TRUE(tmp) << tmp.error().to_string();
    ASSERT_TRUE(write_model(*tmp + "/model.safetensors", model, 4096).ok());
    EXPECT_TRUE(std::filesystem::exists(*tmp));
  }  // not committed
  EXPECT_FALSE(std::filesystem::exists(root + "/step-3.tmp"));
  EXPECT_EQ(CheckpointDir(root).latest_step().error().code(), StatusCode::kNotFound);
  // What a killed writer leaves (no destructor ran), of two other steps.
  for (const char* leftover : {"/step-7.tmp", "/step-9.r1.tmp"}) {
    std::filesystem::create_directories(root + leftover);
    ASSERT_TRUE(write_model(root + leftover + "/model.safetensors", model, 4096).ok());
  }
  CheckpointDir ckpt(root);
  Result<std::string> tmp = ckpt.begin(12);
  ASSERT_TRUE(tmp) << tmp.error().to_string();
  EXPECT_FALSE(std::filesystem::exists(root + "/step-7.tmp"));
  EXPECT_FALSE(std::filesystem::exists(root + "/step-9.r1.tmp"));
  ASSERT_TRUE(write_model(*tmp + "/model.safetensors", model, 4096).ok());
  ASSERT_TRUE(ckpt.commit(12).ok());
  ckpt.abandon();  // nothing pending: the committed checkpoint stays
  EXPECT_EQ(*ckpt.latest_step(), 12);
  EXPECT_TRUE(std::filesystem::exists(root + "/step-12/model.safetensors"));
}

// One writer per root: while one CheckpointDir holds the root's lock —
// another process's, or another object's of this one — a second writer's
// begin() and prune() are refused with the holder's pid, and the first's
// unfinished checkpoint is left alone (begin() would have removed it as a
// killed writer's). The lock goes with the holder, however its process
// ends (here: SIGKILL).
TEST(CheckpointDir, ASecondWriterIsRefusedAndTheFirstsWorkIsLeftAlone) {
  strata::testing::TempDir dir;
  const std::string root = dir.path() + "/ckpt";
  std::vector<TensorInfo> model = {{"w", TensorType::kF32, {1024}}};
  {
    CheckpointDir first(root);
    Result<std::string> tmp = first.begin(5);
    ASSERT_TRUE(tmp) << tmp.error().to_string();
    CheckpointDir second(root);
    Result<std::string> refused = second.begin(6);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), StatusCode::kFailedPrecondition);
    const std::string pid = std::to_string(::getpid());
    EXPECT_NE(refused.error().to_string().find("pid " + pid + ", this process"), std::string::npos)
        << refused.error().to_string();
    EXPECT_EQ(second.prune(1).error().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(std::filesystem::exists(*tmp)) << "the first writer's unfinished checkpoint was removed";
    ASSERT_TRUE(write_model(*tmp + "/model.safetensors", model, 4096).ok());
    ASSERT_TRUE(first.commit(5).ok());
    EXPECT_EQ(*second.latest_step(), 5);  // reading takes no lock
  }
  // Another process holds it, then is killed.
  int ready[2], hold[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CheckpointDir holder(root);
    const char ok = holder.lock().ok() ? 'y' : 'n';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(2);
    char c;
    while (::read(hold[0], &c, 1) < 0) {
    }
    ::_exit(0);  // not reached: killed first
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  CheckpointDir mine(root);
  Status refused = mine.lock();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.to_string().find("(pid " + std::to_string(child) + ","), std::string::npos) << refused.to_string();
  EXPECT_FALSE(mine.begin(7));
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  for (int fd : {ready[0], ready[1], hold[0], hold[1]}) ::close(fd);
  EXPECT_TRUE(mine.lock().ok()) << "the killed holder's lock stayed";
  Result<std::string> tmp = mine.begin(7);
  ASSERT_TRUE(tmp) << tmp.error().to_string();
  ASSERT_TRUE(write_model(*tmp + "/model.safetensors", model, 4096).ok());
  ASSERT_TRUE(mine.commit(7).ok());
  EXPECT_EQ(*mine.latest_step(), 7);
}

// A bounded number of checkpoints: prune(keep) removes the complete
// checkpoints but the `keep` newest (a resave of a step counts after it)
// and whatever `latest` names; unfinished ones and other files stay.
TEST(CheckpointDir, PruneKeepsTheNewestAndTheLatest) {
  strata::testing::TempDir dir;
  const std::string root = dir.path() + "/ckpt/";  // a trailing slash, as a user may write it
  std::vector<TensorInfo> model = {{"w", TensorType::kF32, {1024}}};
  CheckpointDir ckpt(root);
  EXPECT_EQ(*ckpt.prune(2), 0);  // nothing there yet
  for (int64_t step : {2, 4, 6, 6, 8}) {
    Result<std::string> tmp = ckpt.begin(step);
    ASSERT_TRUE(tmp) << tmp.error().to_string();
    ASSERT_TRUE(write_model(*tmp + "/model.safetensors", model, 4096).ok());
    ASSERT_TRUE(ckpt.commit(step).ok());
  }
  std::filesystem::create_directories(root + "step-9.tmp");  // another writer's, unfinished
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(root)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(*ckpt.prune(0), 0);
  EXPECT_EQ(listing().size(), 8u);  // with the writer's .lock
  EXPECT_EQ(*ckpt.prune(2), 3);
  EXPECT_EQ(listing(), (std::vector<std::string>{".lock", "latest", "step-6.r1", "step-8", "step-9.tmp"}));
  // `latest` is never removed, even when it is not among the newest (a
  // resume from an older checkpoint, say).
  {
    std::ofstream latest(root + "latest");
    latest << "step-6.r1\n";
  }
  EXPECT_EQ(*ckpt.prune(1), 0);
  EXPECT_EQ(listing(), (std::vector<std::string>{".lock", "latest", "step-6.r1", "step-8", "step-9.tmp"}));
  EXPECT_EQ(ckpt.prune(-1).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::engine

namespace strata::engine {
namespace {

// Found by fuzz_checkpoint (corpus regression-seal-a-number): sealing a
// record that is not an object threw out of nlohmann's erase(). It is now
// printed unsealed, and open_record refuses it as not a record.
TEST(Records, ARecordThatIsNotAnObjectIsRefusedNotThrown) {
  strata::testing::TempDir dir;
  for (const nlohmann::json& j : {nlohmann::json(0), nlohmann::json::array({1, 2}), nlohmann::json("text")}) {
    const std::string text = seal_record(j);
    const std::string path = dir.path() + "/trainer.json";
    std::ofstream(path) << text;
    bool legacy = false;
    Result<nlohmann::json> r = open_record(path, {}, &legacy);
    ASSERT_FALSE(r) << j.dump();
    EXPECT_EQ(r.error().code(), StatusCode::kDataLoss);
  }
  // An object round-trips, and one edited byte is refused.
  const std::string path = dir.path() + "/r.json";
  std::string text = seal_record(nlohmann::json{{"step", 4}});
  std::ofstream(path) << text;
  bool legacy = true;
  Result<nlohmann::json> r = open_record(path, {}, &legacy);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_FALSE(legacy);
  EXPECT_EQ((*r)["step"], 4);
  text[text.find('4')] = '5';
  std::ofstream(path, std::ios::trunc) << text;
  EXPECT_EQ(open_record(path, {}, &legacy).error().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace strata::engine
