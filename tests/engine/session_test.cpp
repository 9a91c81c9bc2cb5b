// Session: a model of the test's own (an MLP, forward and backward written
// here on the host backend) drives the engine through the session calls.
// The same calls give the same bits in every placement — everything
// resident, or weights and states on NVMe through a device a tenth of the
// model states — and every misuse is an error that changes nothing.
#include "engine/session.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "engine/plan.h"
#include "engine/session_plan.h"
#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::engine {
namespace {

using strata::testing::check_stamped;
using strata::testing::fill_stamped;
using strata::testing::TempDir;

// y = W_L(... tanh(W_1 x + b_1) ...): L square layers of width D, each one
// chunk [W (D x D, row-major out x in) | b (D)], the last one linear; the
// loss is the mean squared error against targets made by a fixed teacher.
struct Mlp {
  int64_t D = 32, L = 4, B = 16;
  int64_t chunk_elems() const { return D * D + D; }
};

// The initial weights of layer l: uniform in +-1/sqrt(D) from its own seed.
Status init_layer(const Mlp& m, int64_t l, std::span<float> dst) {
  std::mt19937 gen(static_cast<uint32_t>(1000 + l));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.D));
  for (int64_t i = 0; i < m.D * m.D; ++i) dst[static_cast<size_t>(i)] = u(gen) * scale;
  for (int64_t i = m.D * m.D; i < m.chunk_elems(); ++i) dst[static_cast<size_t>(i)] = 0.0f;
  return ok_status();
}

// A batch: inputs in [-1, 1] and targets a smooth function of them, from
// a cycle of four batches (so that the loss over a cycle can fall).
void batch(const Mlp& m, int64_t step, std::vector<float>* x, std::vector<float>* y) {
  std::mt19937 gen(static_cast<uint32_t>(7 + step % 4));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  x->resize(static_cast<size_t>(m.B * m.D));
  y->resize(x->size());
  for (auto& v : *x) v = u(gen);
  for (int64_t b = 0; b < m.B; ++b) {
    const float* xb = x->data() + b * m.D;
    for (int64_t j = 0; j < m.D; ++j) (*y)[static_cast<size_t>(b * m.D + j)] = std::sin(xb[j % 3] + 0.5f * xb[(j + 1) % m.D]);
  }
}

// Element i of working weights (or a gradient) in the chunk's type.
float w_at(const void* w, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(w)[i];
  const uint16_t h = static_cast<const uint16_t*>(w)[i];
  return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
void put_w(void* w, DType t, size_t i, float f) {
  if (t == DType::kF32) {
    static_cast<float*>(w)[i] = f;
  } else {
    static_cast<uint16_t*>(w)[i] = t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
  }
}

// Layer l's forward: out = tanh(W in + b) (the last layer linear), for the
// batch's B rows of D; w holds [W | b] in the session's working type t.
void layer_forward(const Mlp& m, int64_t l, const void* w, DType t, const float* in, float* out) {
  for (int64_t b = 0; b < m.B; ++b) {
    for (int64_t o = 0; o < m.D; ++o) {
      float z = w_at(w, t, m.D * m.D + o);
      for (int64_t i = 0; i < m.D; ++i) z += w_at(w, t, o * m.D + i) * in[b * m.D + i];
      out[b * m.D + o] = l + 1 < m.L ? std::tanh(z) : z;
    }
  }
}

// Layer l's backward from dh (d loss / d its output; taken through tanh
// here, in place): its gradient into g (working type t) and d loss / d its
// input into dprev.
void layer_backward(const Mlp& m, int64_t l, const void* w, DType t, const float* in, const float* out,
                    std::vector<float>& dh, std::vector<float>& dprev, void* g) {
  if (l + 1 < m.L) {
    for (size_t i = 0; i < dh.size(); ++i) dh[i] *= 1.0f - out[i] * out[i];
  }
  std::vector<float> gw(static_cast<size_t>(m.chunk_elems()), 0.0f);
  std::fill(dprev.begin(), dprev.end(), 0.0f);
  for (int64_t b = 0; b < m.B; ++b) {
    for (int64_t o = 0; o < m.D; ++o) {
      const float dz = dh[static_cast<size_t>(b * m.D + o)];
      gw[static_cast<size_t>(m.D * m.D + o)] += dz;
      for (int64_t i = 0; i < m.D; ++i) {
        gw[static_cast<size_t>(o * m.D + i)] += dz * in[b * m.D + i];
        dprev[static_cast<size_t>(b * m.D + i)] += dz * w_at(w, t, o * m.D + i);
      }
    }
  }
  for (size_t i = 0; i < gw.size(); ++i) put_w(g, t, i, gw[i]);
}

// The loss of a batch's predictions (the sum of squares over its rows) and
// d(loss * scale) / d(pred) of the mean into dh.
double loss_and_grad(const float* pred, const std::vector<float>& y, float scale, std::vector<float>& dh) {
  double loss = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float d = pred[i] - y[i];
    loss += static_cast<double>(d) * d;
    dh[i] = 2.0f * d / static_cast<float>(y.size()) * scale;
  }
  return loss;
}

// Forward and backward of batch `index` in the open step, each chunk's
// gradient submitted once; returns the loss (unscaled).
// `offload`: the layer inputs go out of the device as activation
// activations (save_activation) and come back in backward, so the device
// holds two of them instead of L + 1.
Result<float> micro_batch(Session& s, const Mlp& m, int64_t index, bool offload) {
  std::vector<float> x, y;
  batch(m, index, &x, &y);
  const size_t act = static_cast<size_t>(m.B * m.D);
  // Activations: the layer inputs h[0..L] (h[0] = x), in the device's
  // memory; offloaded, layer l's input and output in two buffers.
  const int64_t held = offload ? 2 : m.L + 1;
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory acts, s.allocate_device(held * act * 4, "activations"));
  float* h = acts.as<float>();
  auto at = [&](int64_t l) { return h + (offload ? l % 2 : l) * act; };
  std::memcpy(h, x.data(), act * 4);
  for (int64_t l = 0; l < m.L; ++l) {
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(static_cast<size_t>(l)));
    if (offload) STRATA_RETURN_IF_ERROR(s.save_activation(static_cast<uint64_t>(l), at(l), act * 4));
    layer_forward(m, l, w, s.chunk_dtype(static_cast<size_t>(l)), at(l), at(l + 1));
    STRATA_RETURN_IF_ERROR(s.release(static_cast<size_t>(l)));
  }
  std::vector<float> dh(act), dprev(act);
  const double loss = loss_and_grad(at(m.L), y, static_cast<float>(s.loss_scale()), dh);
  for (int64_t l = m.L - 1; l >= 0; --l) {
    const auto c = static_cast<size_t>(l);
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(c));
    STRATA_ASSIGN_OR_RETURN(void* g, s.gradient_buffer(c));
    // Offloaded: layer l + 1's input (this layer's output) is in the other
    // buffer already; its own input comes back into this one.
    if (offload) STRATA_RETURN_IF_ERROR(s.load_activation(static_cast<uint64_t>(l), at(l), act * 4));
    layer_backward(m, l, w, s.chunk_dtype(static_cast<size_t>(l)), at(l), at(l + 1), dh, dprev, g);
    STRATA_RETURN_IF_ERROR(s.release(c));
    STRATA_RETURN_IF_ERROR(s.submit_gradient(c));
    dh.swap(dprev);
  }
  return static_cast<float>(loss / static_cast<double>(act));
}

// The vertical order of a step's grad_accum micro-batches: each layer is
// acquired once a pass and computes every micro-batch while it is on the
// device (their activations all kept), in forward and in backward, so the
// weights move once per pass instead of once per micro-batch. Returns the
// mean loss.
Result<float> vertical_step(Session& s, const Mlp& m, int64_t step) {
  const int A = s.options().grad_accum;
  const size_t act = static_cast<size_t>(m.B * m.D);
  std::vector<std::vector<float>> y(static_cast<size_t>(A));
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory acts, s.allocate_device(A * (m.L + 1) * act * 4, "activations"));
  auto at = [&](int k, int64_t l) { return acts.as<float>() + (static_cast<size_t>(k) * (m.L + 1) + l) * act; };
  for (int k = 0; k < A; ++k) {
    std::vector<float> x;
    batch(m, step * A + k, &x, &y[static_cast<size_t>(k)]);
    std::memcpy(at(k, 0), x.data(), act * 4);
  }
  STRATA_RETURN_IF_ERROR(s.begin_step(1.0f / static_cast<float>(A)));
  for (int64_t l = 0; l < m.L; ++l) {
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(static_cast<size_t>(l)));
    for (int k = 0; k < A; ++k) layer_forward(m, l, w, s.chunk_dtype(static_cast<size_t>(l)), at(k, l), at(k, l + 1));
    STRATA_RETURN_IF_ERROR(s.release(static_cast<size_t>(l)));
  }
  double loss = 0;
  std::vector<std::vector<float>> dh(static_cast<size_t>(A), std::vector<float>(act));
  std::vector<float> dprev(act);
  for (int k = 0; k < A; ++k) {
    // Each micro-batch's loss rounded to float, as micro_batch returns it.
    loss += static_cast<float>(loss_and_grad(at(k, m.L), y[static_cast<size_t>(k)], static_cast<float>(s.loss_scale()),
                                             dh[static_cast<size_t>(k)]) /
                               static_cast<double>(act));
  }
  for (int64_t l = m.L - 1; l >= 0; --l) {
    const auto c = static_cast<size_t>(l);
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(c));
    for (int k = 0; k < A; ++k) {
      STRATA_ASSIGN_OR_RETURN(void* g, s.gradient_buffer(c));
      layer_backward(m, l, w, s.chunk_dtype(static_cast<size_t>(l)), at(k, l), at(k, l + 1), dh[static_cast<size_t>(k)],
                     dprev, g);
      STRATA_RETURN_IF_ERROR(s.submit_gradient(c));  // held: the next micro-batch computes with the same weights
      dh[static_cast<size_t>(k)].swap(dprev);
    }
    STRATA_RETURN_IF_ERROR(s.release(c));
  }
  STRATA_RETURN_IF_ERROR(s.end_step().status());
  return static_cast<float>(loss / A);
}

// One step with the model's compute enqueued on `stream` (the host
// backend's device runs it on a thread of its own) and the session's
// stream-ordered calls: the host thread never waits for a layer, only for
// the loss. Returns the loss (unscaled). `offload`: the layer inputs in two
// buffers, saved after the layer that wrote each (the stream waits for a
// save, activation_saved, only before a layer writes over its buffer) and
// loaded back in backward, prefetched behind the layer above, each copy
// waiting for the stream's reads of its buffer.
Result<float> stream_step(Session& s, const Mlp& m, int64_t step, gpu::Stream stream, bool offload = false) {
  gpu::Device& dev = s.device();
  std::vector<float> x, y;
  batch(m, step, &x, &y);
  const size_t act = static_cast<size_t>(m.B * m.D);
  const int64_t held = offload ? 2 : m.L + 1;
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory acts, s.allocate_device(held * act * 4, "activations"));
  float* h = acts.as<float>();
  auto at = [h, act, held](int64_t l) { return h + (l % held) * act; };
  auto save = [&](int64_t l) {
    return offload ? s.save_activation(static_cast<uint64_t>(l), at(l), act * 4, stream) : ok_status();
  };
  std::memcpy(h, x.data(), act * 4);
  STRATA_RETURN_IF_ERROR(s.begin_step());
  STRATA_RETURN_IF_ERROR(save(0));
  for (int64_t l = 0; l < m.L; ++l) {
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(static_cast<size_t>(l), stream));
    if (offload && l >= 1) STRATA_RETURN_IF_ERROR(s.activation_saved(static_cast<uint64_t>(l - 1), stream));
    const DType t = s.chunk_dtype(static_cast<size_t>(l));
    STRATA_RETURN_IF_ERROR(dev.enqueue(stream, [&m, l, w, t, at] {
      layer_forward(m, l, w, t, at(l), at(l + 1));
      return ok_status();
    }));
    STRATA_RETURN_IF_ERROR(s.release(static_cast<size_t>(l), stream));
    if (l + 1 < m.L) STRATA_RETURN_IF_ERROR(save(l + 1));
  }
  STRATA_RETURN_IF_ERROR(dev.synchronize(stream));  // the loss is the host's
  std::vector<float> da(act), db(act);
  const double loss = loss_and_grad(at(m.L), y, static_cast<float>(s.loss_scale()), da);
  std::vector<float>* dh = &da;
  std::vector<float>* dprev = &db;
  for (int64_t l = m.L - 1; l >= 0; --l) {
    const auto c = static_cast<size_t>(l);
    const auto key = static_cast<uint64_t>(l);
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(c, stream));
    STRATA_ASSIGN_OR_RETURN(void* g, s.gradient_buffer(c));
    if (offload) STRATA_RETURN_IF_ERROR(s.load_activation(key, at(l), act * 4, stream));
    const DType t = s.chunk_dtype(static_cast<size_t>(l));
    STRATA_RETURN_IF_ERROR(dev.enqueue(stream, [&m, l, w, t, at, dh, dprev, g] {
      layer_backward(m, l, w, t, at(l), at(l + 1), *dh, *dprev, g);
      return ok_status();
    }));
    STRATA_RETURN_IF_ERROR(s.release(c));  // acquired on the stream: released after it all the same
    STRATA_RETURN_IF_ERROR(s.submit_gradient(c, stream));
    if (offload && l >= 1) STRATA_RETURN_IF_ERROR(s.prefetch_activation(key - 1, at(l - 1), act * 4, stream));
    std::swap(dh, dprev);
  }
  Result<StepVerdict> v = s.end_step();
  STRATA_RETURN_IF_ERROR(dev.synchronize(stream));  // nothing queued outlives the buffers
  STRATA_RETURN_IF_ERROR(v.status());
  return static_cast<float>(loss / static_cast<double>(act));
}

// One step through the session; returns the loss (unscaled) and the verdict.
Result<float> train_step(Session& s, const Mlp& m, int64_t step, StepVerdict* verdict = nullptr, bool offload = false) {
  STRATA_RETURN_IF_ERROR(s.begin_step());
  STRATA_ASSIGN_OR_RETURN(const float loss, micro_batch(s, m, step, offload));
  STRATA_ASSIGN_OR_RETURN(StepVerdict v, s.end_step());
  if (verdict != nullptr) *verdict = v;
  return loss;
}

// One step of the session's grad_accum micro-batches (batches step * A ..
// step * A + A - 1) at the mean of their gradients; returns the mean loss.
Result<float> accumulated_step(Session& s, const Mlp& m, int64_t step, bool offload = false) {
  const int A = s.options().grad_accum;
  STRATA_RETURN_IF_ERROR(s.begin_step(1.0f / static_cast<float>(A)));
  double loss = 0;
  for (int k = 0; k < A; ++k) {
    STRATA_ASSIGN_OR_RETURN(const float l, micro_batch(s, m, step * A + k, offload));
    loss += l;
  }
  STRATA_RETURN_IF_ERROR(s.end_step().status());
  return static_cast<float>(loss / A);
}

// Each layer's working type where the model registers another than the
// session's precision (empty, or nullopt for a layer: the precision).
using LayerTypes = std::function<std::optional<DType>(int64_t layer)>;

Result<std::unique_ptr<Session>> make_session(const Mlp& m, SessionOptions o, const LayerTypes& types = {}) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(std::move(o)));
  for (int64_t l = 0; l < m.L; ++l) {
    STRATA_RETURN_IF_ERROR(s->add_chunk(
                                "layer" + std::to_string(l), m.chunk_elems(),
                                [&m, l](std::span<float> d) { return init_layer(m, l, d); },
                                types ? types(l) : std::nullopt)
                               .status());
  }
  return s;
}

SessionOptions base_options() {
  SessionOptions o;
  o.adam.lr = 3e-3;
  o.adam.weight_decay = 0.01;
  o.adam.decoupled_weight_decay = true;
  o.pin_memory = false;
  return o;
}

// The weights and the states on NVMe in `dir`.
SessionOptions weights_on_nvme(const std::string& dir) {
  SessionOptions o = base_options();
  o.states = Tier::kNvme;
  o.weights = Tier::kNvme;
  o.nvme_paths = {dir};
  return o;
}

std::vector<float> run(const Mlp& m, SessionOptions o, int steps, std::vector<StepVerdict>* verdicts = nullptr,
                       const LayerTypes& types = {}) {
  Result<std::unique_ptr<Session>> s = make_session(m, std::move(o), types);
  EXPECT_TRUE(s.has_value()) << s.status().to_string();
  if (!s.has_value()) return {};
  std::vector<float> losses;
  for (int k = 0; k < steps; ++k) {
    StepVerdict v;
    Result<float> loss = train_step(**s, m, k, &v);
    EXPECT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
    if (!loss.has_value()) break;
    losses.push_back(*loss);
    if (verdicts != nullptr) verdicts->push_back(v);
  }
  return losses;
}

// The model states of the MLP: 16 bytes per parameter with fp32 Adam (2 B
// weights, 2 B gradient, 12 B master, m, v).
uint64_t model_state_bytes(const Mlp& m) { return static_cast<uint64_t>(m.L * m.chunk_elems()) * 16; }

// Weights, optimizer states and saved activations on NVMe, through a
// device a tenth of the model states: the same losses as all in RAM.
TEST(Session, TheSameBitsResidentAndOnNvmeThroughATenthOfTheModelStates) {
  const Mlp m{64, 8, 8};
  const std::vector<float> resident = run(m, base_options(), 30);
  ASSERT_EQ(resident.size(), 30u);
  const float first = resident[0] + resident[1] + resident[2] + resident[3];
  const float last = resident[26] + resident[27] + resident[28] + resident[29];
  EXPECT_LT(last, 0.5f * first) << "the loss over a cycle of the four batches should fall";
  TempDir dir;
  SessionOptions o = base_options();
  o.states = Tier::kNvme;
  o.weights = Tier::kNvme;
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.device_bytes = model_state_bytes(m) / 10;
  o.prefetch_depth = 1;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  std::vector<float> nvme;
  for (int k = 0; k < 30; ++k) {
    Result<float> loss = train_step(**s, m, k, nullptr, /*offload=*/true);
    ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
    nvme.push_back(*loss);
  }
  for (size_t k = 0; k < resident.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint32_t>(resident[k]), std::bit_cast<uint32_t>(nvme[k]))
        << "step " << k << ": " << resident[k] << " vs " << nvme[k];
  }
  // Everything lived where it was told to, and the device held at most its tenth.
  EXPECT_EQ((*s)->home(0, View::kWeights), Tier::kNvme);
  EXPECT_EQ((*s)->home(0, View::kMaster), Tier::kNvme);
  const SessionCounters k = (*s)->counters();
  EXPECT_LE(k.device_peak_bytes, model_state_bytes(m) / 10);
  EXPECT_GT(k.nvme_read_bytes, 0u);
  EXPECT_GT(k.nvme_written_bytes, 0u);
  EXPECT_GT(k.h2d_bytes, 0u);
}

// The MLP as the planner sees it (plan_model.h): L chunks streamed in
// order, none resident; its layer inputs as fp32 saved activations
// (L + 1 kept on the device, or L saved and two buffers in flight); no
// other device memory (its compute is the host's). `types`: each layer's
// own working type, as make_session registers them.
class MlpPlanModel final : public PlanModel {
 public:
  explicit MlpPlanModel(const Mlp& m, const LayerTypes& types = {})
      : m_(m), chunks_(static_cast<size_t>(m.L), m.chunk_elems()) {
    if (!types) return;
    for (int64_t l = 0; l < m.L; ++l) dtypes_.push_back(types(l).value_or(DType::kBF16));
  }
  const std::vector<int64_t>& chunk_elems() const override { return chunks_; }
  std::vector<DType> chunk_dtypes() const override { return dtypes_; }
  int64_t parameters() const override { return m_.L * m_.chunk_elems(); }
  bool resident_first() const override { return false; }
  Status check(int64_t micro_batch) const override {
    return micro_batch == m_.B ? ok_status() : invalid_argument("the MLP's batch is " + std::to_string(m_.B));
  }
  ModelActivations activations(int64_t micro_batch, DType) const override {
    return {m_.L + 1, m_.L, static_cast<uint64_t>(micro_batch * m_.D) * 4};
  }
  ModelDeviceBytes device_bytes(const ModelPass& p) const override {
    ModelDeviceBytes b;
    b.activations_kept = static_cast<uint64_t>((p.offload_activations ? 2 : m_.L + 1) * p.micro_batch * m_.D) * 4;
    return b;
  }
  double flops(int64_t micro_batch) const override { return 6.0 * static_cast<double>(parameters() * micro_batch); }

 private:
  Mlp m_;
  std::vector<int64_t> chunks_;
  std::vector<DType> dtypes_;
};

// A model of a trainer's own is planned by what it says of itself: over
// the session's placements the planner's bytes of every tier are what the
// session and the model allocated, to the byte, and the bytes it puts on
// the links each way are what a step copied. The same with layers of
// their own working type (fp32 beside bf16), whose weights stay in RAM.
TEST(Session, ThePlannerCountsWhatASessionOfAModelOfItsOwnAllocates) {
  const Mlp m{32, 5, 8};
  TempDir dir;
  int n = 0;
  const LayerTypes mixed = [](int64_t l) { return l % 2 == 1 ? std::optional(DType::kF32) : std::nullopt; };
  for (const LayerTypes& types : {LayerTypes{}, mixed}) {
    for (Tier states : {Tier::kHost, Tier::kNvme}) {
      for (Tier weights : {Tier::kHost, Tier::kNvme}) {
        if (weights == Tier::kNvme && (states != Tier::kNvme || types)) continue;
        for (Tier acts : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
          for (int depth : {1, 3}) {
            SessionOptions o = base_options();
            o.states = states;
            o.weights = weights;
            // Checkpoints on the device: the model keeps them (the session's
            // tier is then unused).
            o.activations = acts == Tier::kDevice ? Tier::kHost : acts;
            o.prefetch_depth = depth;
            o.nvme_paths = {dir.sub("p" + std::to_string(n++))};
            TrainSetup setup = session_setup(o);
            setup.model = std::make_shared<MlpPlanModel>(m, types);
            setup.micro_batch = m.B;
            Placement pl = session_placement(o);
            pl.activations = acts;
            ASSERT_TRUE(check_placement(setup, pl).ok());
            const Plan plan = estimate(setup, pl, Bandwidths{});
            Result<std::unique_ptr<Session>> s = make_session(m, o, types);
            ASSERT_TRUE(s.has_value()) << s.status().to_string();
            SessionCounters before;
            for (int k = 0; k < 2; ++k) {
              before = (*s)->counters();
              Result<float> loss = train_step(**s, m, k, nullptr, /*offload=*/acts != Tier::kDevice);
              ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
            }
            const std::string what =
                placement_text(pl) + ", depth " + std::to_string(depth) + (types ? ", fp32 beside bf16" : "");
            // A step's copies each way (weights, gradients, saved activations),
            // in this model's order (no resident chunk).
            const SessionCounters after = (*s)->counters();
            for (const LinkTime& l : plan.links) {
              if (l.link == "host->device") {
                EXPECT_EQ(l.bytes, static_cast<double>(after.h2d_bytes - before.h2d_bytes)) << what;
              } else if (l.link == "device->host") {
                EXPECT_EQ(l.bytes, static_cast<double>(after.d2h_bytes - before.d2h_bytes)) << what;
              }
            }
            EXPECT_EQ(plan.device.total(), (*s)->counters().device_peak_bytes) << what;
            // The session stages NVMe saved activations in up to four pinned pages,
            // two of them for prefetches; loading without prefetching, this
            // model leaves one of those unallocated.
            const uint64_t unused_staging = acts == Tier::kNvme ? 4096 : 0;
            EXPECT_EQ(plan.host.total(), (*s)->host_bytes() + unused_staging) << what;
            const uint64_t nvme = (*s)->swap_store() ? (*s)->swap_store()->stats().peak_used_bytes : 0;
            EXPECT_EQ(plan.nvme.total(), nvme) << what;
          }
        }
      }
    }
  }
}

// A session planned for its model: under a host budget the states do not
// fit, the plan streams them from NVMe, and the session of the planned
// options trains within every budget, allocating what the plan says.
TEST(Session, APlannedSessionRunsWithinItsBudgets) {
  const Mlp m{64, 16, 8};
  TempDir dir;
  SessionOptions o = base_options();
  o.nvme_paths = {dir.path()};
  const auto model = std::make_shared<MlpPlanModel>(m);
  Budgets budgets;
  budgets.device_bytes = 256 << 10;
  budgets.host_bytes = 512 << 10;  // the states alone take 12 bytes a parameter: 780 KiB
  budgets.nvme_bytes = 64 << 20;
  Result<Plan> plan = plan_session(o, model, m.B, budgets);
  ASSERT_TRUE(plan.has_value()) << plan.status().to_string();
  EXPECT_TRUE(fits(*plan, budgets));
  EXPECT_EQ(plan->placement.states, Tier::kNvme) << plan->why;
  apply_session_plan(*plan, &o);
  o.device_bytes = budgets.device_bytes;
  o.host_budget_bytes = budgets.host_bytes;
  o.nvme_budget_bytes = budgets.nvme_bytes;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  const bool offload = plan->placement.activations != Tier::kDevice;
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(train_step(**s, m, k, nullptr, offload).has_value());
  EXPECT_EQ(plan->device.total(), (*s)->counters().device_peak_bytes);
  EXPECT_LE((*s)->host_bytes(), budgets.host_bytes);
  // Fixed on the device, the weights are refused: a session streams them.
  Constraints on_device;
  on_device.weights = Tier::kDevice;
  EXPECT_EQ(plan_session(o, model, m.B, budgets, {}, on_device).status().code(), StatusCode::kInvalidArgument);
  // Nothing fits a device of one slot's bytes.
  budgets.device_bytes = 1024;
  EXPECT_EQ(plan_session(o, model, m.B, budgets).status().code(), StatusCode::kResourceExhausted);
}

// Layers of their own working type are planned as they are registered:
// where the weights would go on NVMe for a model of one type (a host
// budget too small for them beside the states' staging), a model with
// fp32 layers keeps its weights and gradients in RAM, the planner counts
// each layer's own bytes, and the session of the plan starts where the
// one-type plan's placement is refused.
TEST(Session, APlanKeepsTheWeightsOfLayersOfTheirOwnTypeInRam) {
  const Mlp m{64, 16, 8};
  TempDir dir;
  SessionOptions o = base_options();
  o.nvme_paths = {dir.path()};
  const LayerTypes mixed = [](int64_t l) { return l == 3 ? std::optional(DType::kF32) : std::nullopt; };
  Budgets budgets;
  budgets.device_bytes = 256 << 10;
  budgets.nvme_bytes = 64 << 20;
  // The smallest host budget the one-type model fits.
  budgets.host_bytes = 64 << 10;
  Result<Plan> one_type = plan_session(o, std::make_shared<MlpPlanModel>(m), m.B, budgets);
  for (; !one_type.has_value() && budgets.host_bytes < (8u << 20); budgets.host_bytes += 16 << 10) {
    one_type = plan_session(o, std::make_shared<MlpPlanModel>(m), m.B, budgets);
  }
  ASSERT_TRUE(one_type.has_value()) << one_type.status().to_string();
  ASSERT_EQ(one_type->placement.weights, Tier::kNvme) << one_type->why;
  // With a layer in fp32 the weights stay in RAM: a larger budget.
  Result<Plan> plan = plan_session(o, std::make_shared<MlpPlanModel>(m, mixed), m.B, budgets);
  for (; !plan.has_value() && budgets.host_bytes < (8u << 20); budgets.host_bytes += 16 << 10) {
    plan = plan_session(o, std::make_shared<MlpPlanModel>(m, mixed), m.B, budgets);
  }
  ASSERT_TRUE(plan.has_value()) << plan.status().to_string();
  EXPECT_EQ(plan->placement.weights, Tier::kHost);
  EXPECT_EQ(plan->placement.gradients, Tier::kHost);
  SessionOptions planned = o;
  apply_session_plan(*plan, &planned);
  planned.device_bytes = budgets.device_bytes;
  planned.host_budget_bytes = budgets.host_bytes;
  planned.nvme_budget_bytes = budgets.nvme_bytes;
  Result<std::unique_ptr<Session>> s = make_session(m, planned, mixed);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  const bool offload = plan->placement.activations != Tier::kDevice;
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(train_step(**s, m, k, nullptr, offload).has_value());
  EXPECT_EQ(plan->device.total(), (*s)->counters().device_peak_bytes);
  EXPECT_LE((*s)->host_bytes(), budgets.host_bytes);
  // The one-type plan's placement is refused for the mixed model, by name.
  SessionOptions refused = o;
  apply_session_plan(*one_type, &refused);
  Result<std::unique_ptr<Session>> r = make_session(m, refused, mixed);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  EXPECT_EQ((*r)->start().code(), StatusCode::kFailedPrecondition);
  // A type per chunk, and only the session's kinds.
  const std::vector<DType> half = {DType::kF16};
  class Typed final : public PlanModel {
   public:
    Typed(const Mlp& m, std::vector<DType> t) : inner_(m), types_(std::move(t)) {}
    const std::vector<int64_t>& chunk_elems() const override { return inner_.chunk_elems(); }
    std::vector<DType> chunk_dtypes() const override { return types_; }
    int64_t parameters() const override { return inner_.parameters(); }
    bool resident_first() const override { return false; }
    Status check(int64_t b) const override { return inner_.check(b); }
    ModelActivations activations(int64_t b, DType t) const override { return inner_.activations(b, t); }
    ModelDeviceBytes device_bytes(const ModelPass& p) const override { return inner_.device_bytes(p); }
    double flops(int64_t b) const override { return inner_.flops(b); }

   private:
    MlpPlanModel inner_;
    std::vector<DType> types_;
  };
  std::vector<DType> fp16(static_cast<size_t>(m.L), DType::kBF16);
  fp16[2] = DType::kF16;
  EXPECT_EQ(plan_session(o, std::make_shared<Typed>(m, fp16), m.B, budgets).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_session(o, std::make_shared<Typed>(m, half), m.B, budgets).status().code(),
            StatusCode::kInvalidArgument);
}

// A model computing on a stream of its own, the session ordering its
// copies on the device (acquire, release and submit on the stream): the
// same bits as the blocking calls, in RAM and with the weights and states
// on NVMe through two weight slots (each refill waits for the compute that
// read the slot before).
TEST(Session, StreamOrderedCallsGiveTheSameBits) {
  const Mlp m{32, 6, 8};
  const std::vector<float> blocking = run(m, base_options(), 8);
  ASSERT_EQ(blocking.size(), 8u);
  TempDir dir;
  SessionOptions on_nvme = weights_on_nvme(dir.path());
  on_nvme.prefetch_depth = 1;
  for (const SessionOptions& o : {base_options(), on_nvme}) {
    SCOPED_TRACE(tier_name(o.weights));
    Result<std::unique_ptr<Session>> s = make_session(m, o);
    ASSERT_TRUE(s.has_value() && (*s)->start().ok());
    Result<gpu::Stream> stream = (*s)->device().create_stream("model");
    ASSERT_TRUE(stream.has_value());
    for (int k = 0; k < 8; ++k) {
      Result<float> loss = stream_step(**s, m, k, *stream);
      ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
      EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(blocking[static_cast<size_t>(k)]))
          << "step " << k;
    }
  }
}

// Stream-ordered saves, loads and prefetches of the activation
// activations give the same bits as the blocking calls, in RAM and on
// NVMe; activation_saved of a key never saved is NotFound.
TEST(Session, StreamOrderedActivationCallsGiveTheSameBits) {
  const Mlp m{32, 6, 8};
  const std::vector<float> blocking = run(m, base_options(), 6);
  ASSERT_EQ(blocking.size(), 6u);
  TempDir dir;
  for (Tier tier : {Tier::kHost, Tier::kNvme}) {
    SCOPED_TRACE(tier_name(tier));
    SessionOptions o = base_options();
    o.activations = tier;
    o.nvme_paths = {dir.sub(std::string(tier_name(tier)))};
    Result<std::unique_ptr<Session>> s = make_session(m, o);
    ASSERT_TRUE(s.has_value() && (*s)->start().ok());
    Result<gpu::Stream> stream = (*s)->device().create_stream("model");
    ASSERT_TRUE(stream.has_value());
    for (int k = 0; k < 6; ++k) {
      Result<float> loss = stream_step(**s, m, k, *stream, /*offload=*/true);
      ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
      EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(blocking[static_cast<size_t>(k)]))
          << "step " << k;
    }
    EXPECT_EQ((*s)->activation_saved(99, *stream).code(), StatusCode::kNotFound);
    EXPECT_TRUE((*s)->finalize().ok());
  }
}

TEST(Session, ActivationCheckpointsOnTheHostOrNvmeGiveTheSameBits) {
  const Mlp m{32, 6, 8};
  const std::vector<float> kept = run(m, base_options(), 6);
  ASSERT_EQ(kept.size(), 6u);
  TempDir dir;
  for (Tier tier : {Tier::kHost, Tier::kNvme}) {
    SessionOptions o = base_options();
    o.activations = tier;
    o.nvme_paths = {dir.path()};
    Result<std::unique_ptr<Session>> s = make_session(m, o);
    ASSERT_TRUE(s.has_value()) << s.status().to_string();
    for (int k = 0; k < 6; ++k) {
      Result<float> loss = train_step(**s, m, k, nullptr, /*offload=*/true);
      ASSERT_TRUE(loss.has_value()) << tier_name(tier) << ": " << loss.status().to_string();
      EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(kept[static_cast<size_t>(k)]))
          << tier_name(tier) << ", step " << k;
    }
    // Misuse: an unknown key, a wrong size.
    std::vector<float> buf(static_cast<size_t>(m.B * m.D));
    EXPECT_EQ((*s)->load_activation(99, buf.data(), buf.size() * 4).code(), StatusCode::kNotFound);
    EXPECT_EQ((*s)->load_activation(0, buf.data(), 8).code(), StatusCode::kInvalidArgument);
  }
}

// A started session of `m` and, on its device, a source and two
// destinations of `bytes`.
struct ActivationRig {
  std::unique_ptr<Session> session;
  gpu::DeviceMemory src, a, b;
};
Result<ActivationRig> activation_rig(const Mlp& m, const SessionOptions& o, uint64_t bytes) {
  ActivationRig r;
  STRATA_ASSIGN_OR_RETURN(r.session, make_session(m, o));
  STRATA_RETURN_IF_ERROR(r.session->start());
  STRATA_ASSIGN_OR_RETURN(r.src, r.session->allocate_device(bytes, "source"));
  STRATA_ASSIGN_OR_RETURN(r.a, r.session->allocate_device(bytes, "a"));
  STRATA_ASSIGN_OR_RETURN(r.b, r.session->allocate_device(bytes, "b"));
  return r;
}

// A prefetched activation is the bytes saved, in the buffer it was asked
// into, on either tier; a load into another buffer, a save over the key
// and more prefetches than staging buffers all wait for it; a failed read
// is the load's error.
TEST(Session, PrefetchedActivationsAreTheBytesSaved) {
  const Mlp m{16, 2, 4};
  TempDir dir;
  constexpr uint64_t kBytes = 3000;
  for (Tier tier : {Tier::kHost, Tier::kNvme}) {
    SCOPED_TRACE(tier_name(tier));
    SessionOptions o = base_options();
    o.activations = tier;
    o.nvme_paths = {dir.sub(std::string(tier_name(tier)))};
    Result<ActivationRig> rig = activation_rig(m, o, kBytes);
    ASSERT_TRUE(rig.has_value()) << rig.status().to_string();
    Session& f = *rig->session;
    gpu::DeviceMemory *a = &rig->a, *b = &rig->b;
    std::byte* bytes = rig->src.as<std::byte>();
    for (uint64_t key = 0; key < 4; ++key) {
      fill_stamped(bytes, kBytes, key * kBytes, 7);
      ASSERT_TRUE(f.save_activation(key, bytes, kBytes).ok());
    }
    auto holds = [&](const gpu::DeviceMemory& mem, uint64_t key) {
      return check_stamped(mem.as<std::byte>(), kBytes, key * kBytes, 7);
    };
    ASSERT_TRUE(f.prefetch_activation(1, a->data(), kBytes).ok());
    ASSERT_TRUE(f.load_activation(1, a->data(), kBytes).ok());
    EXPECT_EQ(holds(*a, 1), "");
    ASSERT_TRUE(f.prefetch_activation(2, a->data(), kBytes).ok());
    ASSERT_TRUE(f.load_activation(2, b->data(), kBytes).ok());  // another buffer: the prefetch lands first
    EXPECT_EQ(holds(*b, 2), "");
    EXPECT_EQ(holds(*a, 2), "");
    // Three in flight from two staging buffers; each load gets its own.
    Result<gpu::DeviceMemory> c = f.allocate_device(kBytes, "c");
    ASSERT_TRUE(c.has_value());
    ASSERT_TRUE(f.prefetch_activation(0, a->data(), kBytes).ok());
    ASSERT_TRUE(f.prefetch_activation(1, b->data(), kBytes).ok());
    ASSERT_TRUE(f.prefetch_activation(3, c->data(), kBytes).ok());
    ASSERT_TRUE(f.load_activation(3, c->data(), kBytes).ok());
    ASSERT_TRUE(f.load_activation(0, a->data(), kBytes).ok());
    ASSERT_TRUE(f.load_activation(1, b->data(), kBytes).ok());
    EXPECT_EQ(holds(*a, 0), "");
    EXPECT_EQ(holds(*b, 1), "");
    EXPECT_EQ(holds(*c, 3), "");
    // A save over a key with its prefetch in flight: the load that follows
    // has the new bytes.
    ASSERT_TRUE(f.prefetch_activation(2, a->data(), kBytes).ok());
    fill_stamped(bytes, kBytes, 9 * kBytes, 7);
    ASSERT_TRUE(f.save_activation(2, bytes, kBytes).ok());
    ASSERT_TRUE(f.load_activation(2, a->data(), kBytes).ok());
    EXPECT_EQ(holds(*a, 9), "");
    // Misuse: an unknown key, a wrong size.
    EXPECT_EQ(f.prefetch_activation(99, a->data(), kBytes).code(), StatusCode::kNotFound);
    EXPECT_EQ(f.prefetch_activation(0, a->data(), 8).code(), StatusCode::kInvalidArgument);
  }
  // Every NVMe read corrupted: the prefetch starts, its load reports it.
  SessionOptions o = base_options();
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.sub("faulty")};
  o.faults = io::FaultConfig{};
  o.faults->corrupt_one_in = 1;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value() && (*s)->start().ok());
  Result<gpu::DeviceMemory> buf = (*s)->allocate_device(kBytes, "buffer");
  ASSERT_TRUE(buf.has_value());
  ASSERT_TRUE((*s)->save_activation(5, buf->data(), kBytes).ok());
  ASSERT_TRUE((*s)->prefetch_activation(5, buf->data(), kBytes).ok());
  const Status failed = (*s)->load_activation(5, buf->data(), kBytes);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.to_string().find("prefetching activation 5"), std::string::npos) << failed.to_string();
  EXPECT_TRUE((*s)->async_error().ok()) << "the read's error is the load's, not a stray one";
}

// A save to NVMe returns with its write in flight; a write that fails is
// the error of what next needs it: the load of the key, or finalize.
TEST(Session, AFailedActivationWriteIsTheNextLoadsOrFinalizesError) {
  const Mlp m{16, 2, 4};
  TempDir dir;
  SessionOptions o = base_options();
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.faults = io::FaultConfig{};
  o.faults->eio_persistent_one_in = 1;  // every request fails
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value() && (*s)->start().ok());
  Result<gpu::DeviceMemory> buf = (*s)->allocate_device(4096, "buffer");
  ASSERT_TRUE(buf.has_value());
  // The writes go out (the faults strike as they complete).
  ASSERT_TRUE((*s)->save_activation(1, buf->data(), 4096).ok());
  const Status loaded = (*s)->load_activation(1, buf->data(), 4096);
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.to_string().find("saving activation 1"), std::string::npos) << loaded.to_string();
  ASSERT_TRUE((*s)->save_activation(2, buf->data(), 4096).ok());
  const Status finalized = (*s)->finalize();
  EXPECT_FALSE(finalized.ok());
  EXPECT_NE(finalized.to_string().find("saving activation 2"), std::string::npos) << finalized.to_string();
  EXPECT_TRUE((*s)->finalize().ok()) << "reported once";
}

// A prefetch whose read fails is the error of the load that wants its
// bytes, of nothing else: not of a save over its key (the bytes are
// replaced), nor, once its step is cancelled, of a later load of the key.
TEST(Session, AFailedPrefetchIsNoLaterCallsError) {
  const Mlp m{16, 2, 4};
  TempDir dir;
  constexpr uint64_t kBytes = 4096;
  SessionOptions o = base_options();
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.faults = io::FaultConfig{};
  Result<ActivationRig> rig = activation_rig(m, o, kBytes);
  ASSERT_TRUE(rig.has_value()) << rig.status().to_string();
  Session& s = *rig->session;
  gpu::DeviceMemory *a = &rig->a, *b = &rig->b;
  std::byte* bytes = rig->src.as<std::byte>();
  fill_stamped(bytes, kBytes, 0, 3);
  ASSERT_TRUE(s.save_activation(1, bytes, kBytes).ok());
  auto reads_fail = [&](bool on) {
    s.swap_store()->with_faults([on](io::FaultyDevice& d) {
      if (on) {
        d.fail_next(io::IoOp::kRead, EIO, 1000);
      } else {
        d.clear_forced();
      }
    });
  };
  reads_fail(true);
  ASSERT_TRUE(s.prefetch_activation(1, a->data(), kBytes).ok());
  fill_stamped(bytes, kBytes, kBytes, 3);
  const Status saved = s.save_activation(1, bytes, kBytes);
  EXPECT_TRUE(saved.ok()) << saved.to_string();
  reads_fail(false);
  ASSERT_TRUE(s.load_activation(1, a->data(), kBytes).ok());
  EXPECT_EQ(check_stamped(a->as<std::byte>(), kBytes, kBytes, 3), "");
  // In a step that is cancelled (the model's compute failed, say).
  ASSERT_TRUE(s.begin_step(1.0f).ok());
  reads_fail(true);
  ASSERT_TRUE(s.prefetch_activation(1, a->data(), kBytes).ok());
  ASSERT_TRUE(s.cancel_step().ok());
  reads_fail(false);
  const Status loaded = s.load_activation(1, b->data(), kBytes);
  EXPECT_TRUE(loaded.ok()) << loaded.to_string();
  EXPECT_EQ(check_stamped(b->as<std::byte>(), kBytes, kBytes, 3), "");
  EXPECT_TRUE(s.finalize().ok());
}

// A save the NVMe budget cannot hold: blocking, it fails there with
// nothing of it kept (its key was never saved); stream-ordered, its write
// is refused once issued and the key's load reports it.
TEST(Session, ASaveBeyondTheNvmeBudgetFailsWithNothingKept) {
  const Mlp m{16, 2, 4};
  TempDir dir;
  SessionOptions o = base_options();
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.nvme_budget_bytes = 8192;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value() && (*s)->start().ok());
  Result<gpu::DeviceMemory> buf = (*s)->allocate_device(16384, "buffer");
  ASSERT_TRUE(buf.has_value());
  ASSERT_TRUE((*s)->save_activation(1, buf->data(), 4096).ok());
  const Status over = (*s)->save_activation(2, buf->data(), 16384);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted) << over.to_string();
  EXPECT_EQ((*s)->load_activation(2, buf->data(), 16384).code(), StatusCode::kNotFound);
  EXPECT_TRUE((*s)->load_activation(1, buf->data(), 4096).ok());
  Result<gpu::Stream> stream = (*s)->device().create_stream("model");
  ASSERT_TRUE(stream.has_value());
  ASSERT_TRUE((*s)->save_activation(3, buf->data(), 16384, *stream).ok());
  const Status loaded = (*s)->load_activation(3, buf->data(), 16384);
  EXPECT_EQ(loaded.code(), StatusCode::kResourceExhausted) << loaded.to_string();
  EXPECT_NE(loaded.to_string().find("saving activation 3"), std::string::npos) << loaded.to_string();
}

TEST(Session, ClippingAndItsRollbackGiveTheSameBitsOnEveryTierAndWithSpeculationInRam) {
  const Mlp m{32, 4, 16};
  SessionOptions o = base_options();
  o.clip_norm = 0.05f;  // fires on the first steps, not on all: speculation guesses wrong and right
  std::vector<StepVerdict> host_v, nvme_v;
  const std::vector<float> host = run(m, o, 12, &host_v);
  TempDir dir;
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  const std::vector<float> nvme = run(m, o, 12, &nvme_v);
  // In RAM with a second copy of the states, speculating as on NVMe.
  std::vector<StepVerdict> ram_v;
  SessionOptions in_ram = base_options();
  in_ram.clip_norm = o.clip_norm;
  in_ram.speculate_in_ram = true;
  const std::vector<float> ram = run(m, in_ram, 12, &ram_v);
  ASSERT_EQ(host.size(), nvme.size());
  ASSERT_EQ(host.size(), ram.size());
  int clipped = 0, rolled = 0, rolled_in_ram = 0;
  for (size_t k = 0; k < host.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint32_t>(host[k]), std::bit_cast<uint32_t>(nvme[k])) << "step " << k;
    EXPECT_EQ(std::bit_cast<uint32_t>(host[k]), std::bit_cast<uint32_t>(ram[k])) << "step " << k;
    EXPECT_EQ(host_v[k].clipped, nvme_v[k].clipped) << "step " << k;
    EXPECT_EQ(host_v[k].grad_norm, nvme_v[k].grad_norm) << "step " << k;
    EXPECT_EQ(host_v[k].grad_norm, ram_v[k].grad_norm) << "step " << k;
    clipped += host_v[k].clipped ? 1 : 0;
    rolled += nvme_v[k].rolled_back ? 1 : 0;
    rolled_in_ram += ram_v[k].rolled_back ? 1 : 0;
    EXPECT_FALSE(host_v[k].rolled_back) << "in RAM without speculation nothing is undone";
  }
  EXPECT_GT(clipped, 0) << "the test should clip some steps";
  EXPECT_GT(rolled, 0) << "the NVMe run should have rolled a speculative step back";
  EXPECT_GT(rolled_in_ram, 0) << "speculating in RAM should have rolled a step back too";
}

// Speculation in RAM holds a second copy of the states, and the host
// budget counts it before anything is allocated.
TEST(Session, SpeculationInRamHoldsASecondCopyOfTheStates) {
  const Mlp m{32, 4, 16};
  SessionOptions o = base_options();
  Result<std::unique_ptr<Session>> plain = make_session(m, o);
  ASSERT_TRUE(plain.has_value() && (*plain)->start().ok());
  o.speculate_in_ram = true;
  Result<std::unique_ptr<Session>> twice = make_session(m, o);
  ASSERT_TRUE(twice.has_value() && (*twice)->start().ok());
  const uint64_t states = static_cast<uint64_t>(m.L * m.chunk_elems()) * 12;  // fp32 master, m, v
  EXPECT_GE((*twice)->host_bytes(), (*plain)->host_bytes() + states);
  o.host_budget_bytes = (*plain)->host_bytes() + states / 2;
  Result<std::unique_ptr<Session>> refused = make_session(m, o);
  ASSERT_TRUE(refused.has_value());
  const Status start = (*refused)->start();
  EXPECT_EQ(start.code(), StatusCode::kResourceExhausted) << start.to_string();
}

// Three micro-batches a step, their gradients added up by the session: the
// same bits resident and with weights, states and saved activations
// on NVMe through a device a tenth of the model states; the loss falls.
TEST(Session, AccumulatedMicroBatchesGiveTheSameBitsOnEveryPlacement) {
  const Mlp m{64, 8, 8};
  constexpr int kSteps = 12;
  SessionOptions o = base_options();
  o.grad_accum = 3;
  std::vector<float> resident;
  {
    Result<std::unique_ptr<Session>> s = make_session(m, o);
    ASSERT_TRUE(s.has_value()) << s.status().to_string();
    for (int k = 0; k < kSteps; ++k) {
      Result<float> loss = accumulated_step(**s, m, k);
      ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
      resident.push_back(*loss);
    }
  }
  const float first = resident[0] + resident[1] + resident[2] + resident[3];
  const float last = resident[8] + resident[9] + resident[10] + resident[11];
  EXPECT_LT(last, 0.8f * first) << "the loss should fall";
  TempDir dir;
  o.states = Tier::kNvme;
  o.weights = Tier::kNvme;
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.device_bytes = model_state_bytes(m) / 10;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  for (int k = 0; k < kSteps; ++k) {
    Result<float> loss = accumulated_step(**s, m, k, /*offload=*/true);
    ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(resident[static_cast<size_t>(k)]))
        << "step " << k << ": " << *loss << " on NVMe vs " << resident[static_cast<size_t>(k)] << " resident";
  }
  EXPECT_LE((*s)->counters().device_peak_bytes, model_state_bytes(m) / 10);
}

// The micro-batches' gradients are added in fp32, not in the working type:
// one Adam step on a chunk against cpu_optim's step on the fp32 sum. The
// second gradient is below the first's bf16 spacing, so a sum rounded to
// bf16 would update differently (checked: the test can fail).
TEST(Session, AccumulationAddsTheMicroBatchesInFp32) {
  constexpr int64_t n = 256;
  SessionOptions o = base_options();
  o.adam.lr = 1.0;
  o.adam.eps = 1.0;  // the update then depends on the gradient's size, not just its sign
  o.adam.weight_decay = 0;
  o.grad_accum = 2;
  Result<std::unique_ptr<Session>> made = Session::create(o);
  ASSERT_TRUE(made.has_value()) << made.status().to_string();
  Session& s = **made;
  ASSERT_TRUE(s.add_chunk("w", n, {}).has_value());
  std::vector<uint16_t> g0(n), g1(n);
  std::vector<float> sum(n), rounded(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<size_t>(i);
    g0[u] = f32_to_bf16(1.0f + static_cast<float>(i) / 64.0f);
    g1[u] = f32_to_bf16(std::ldexp(1.0f, -9) * static_cast<float>(1 + i % 3));
    sum[u] = bf16_to_f32(g0[u]) + bf16_to_f32(g1[u]);
    rounded[u] = bf16_to_f32(f32_to_bf16(sum[u]));
  }
  ASSERT_TRUE(s.begin_step(0.5f).ok());
  for (const std::vector<uint16_t>* g : {&g0, &g1}) {
    ASSERT_TRUE(s.acquire(0).has_value());
    ASSERT_TRUE(s.release(0).ok());
    Result<void*> buf = s.gradient_buffer(0);
    ASSERT_TRUE(buf.has_value()) << buf.status().to_string();
    std::memcpy(*buf, g->data(), n * 2);
    ASSERT_TRUE(s.submit_gradient(0).ok());
  }
  Result<StepVerdict> v = s.end_step();
  ASSERT_TRUE(v.has_value()) << v.status().to_string();
  std::vector<float> got(n);
  ASSERT_TRUE(s.read_master(0, got).ok());
  auto reference = [&](const std::vector<float>& grad) {
    std::vector<float> p(n, 0.0f), mm(n, 0.0f), vv(n, 0.0f);
    cpu_optim::ParamSpan span;
    span.params = p.data();
    span.n = n;
    span.grad = grad.data();
    span.grad_dtype = DType::kF32;
    span.state.m = mm.data();
    span.state.v = vv.data();
    cpu_optim::StepOptions so;
    so.grad_scale = 0.5f;
    Result<std::unique_ptr<cpu_optim::Executor>> ex = cpu_optim::Executor::create({});
    EXPECT_TRUE(ex.has_value());
    EXPECT_TRUE(cpu_optim::step(o.adam, 1, span, so, **ex).has_value());
    return p;
  };
  const std::vector<float> want = reference(sum), wrong = reference(rounded);
  int differs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<size_t>(i);
    ASSERT_EQ(std::bit_cast<uint32_t>(got[u]), std::bit_cast<uint32_t>(want[u]))
        << "element " << i << ": " << got[u] << " vs " << want[u];
    differs += std::bit_cast<uint32_t>(want[u]) != std::bit_cast<uint32_t>(wrong[u]);
  }
  EXPECT_GT(differs, n / 2) << "the bf16-rounded sum should update differently";
}

// fp32 working weights: the device computes with the master weights' own
// bits and the loss falls; the states and saved activations on NVMe
// through a device a tenth of the model states (20 bytes a parameter: 4
// working, 4 gradient, 12 master and Adam) give the same bits as all in RAM.
TEST(Session, Fp32WorkingWeightsAreTheMasterWeightsOnEveryPlacement) {
  SessionOptions o = base_options();
  o.precision = DType::kF32;
  {
    const Mlp m{64, 8, 8};
    const std::vector<float> losses = run(m, o, 30);
    ASSERT_EQ(losses.size(), 30u);
    EXPECT_LT(losses[26] + losses[27] + losses[28] + losses[29], 0.5f * (losses[0] + losses[1] + losses[2] + losses[3]))
        << "the loss over a cycle of the four batches should fall";
    Result<std::unique_ptr<Session>> s = make_session(m, o);
    ASSERT_TRUE(s.has_value()) << s.status().to_string();
    for (int k = 0; k < 3; ++k) ASSERT_TRUE(train_step(**s, m, k).has_value());
    std::vector<float> master(static_cast<size_t>(m.chunk_elems()));
    for (size_t c = 0; c < (*s)->chunks(); ++c) {
      ASSERT_TRUE((*s)->read_master(c, master).ok());
      ASSERT_TRUE((*s)->begin_step().ok());
      Result<const void*> w = (*s)->acquire(c);
      ASSERT_TRUE(w.has_value()) << w.status().to_string();
      EXPECT_EQ(0, std::memcmp(*w, master.data(), master.size() * 4)) << "chunk " << c;
      ASSERT_TRUE((*s)->release(c).ok());
      ASSERT_TRUE((*s)->cancel_step().ok());
    }
  }
  const Mlp m{64, 16, 8};
  const uint64_t fp32_model_states = static_cast<uint64_t>(m.L * m.chunk_elems()) * 20;
  const std::vector<float> in_ram = run(m, o, 8);
  ASSERT_EQ(in_ram.size(), 8u);
  TempDir dir;
  o.states = Tier::kNvme;
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.device_bytes = fp32_model_states / 10;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  for (size_t k = 0; k < in_ram.size(); ++k) {
    Result<float> loss = train_step(**s, m, static_cast<int64_t>(k), nullptr, /*offload=*/true);
    ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(in_ram[k])) << "step " << k;
  }
  EXPECT_LE((*s)->counters().device_peak_bytes, fp32_model_states / 10);
}

// A model's chunks in a type of their own (fp32 layers beside bf16 ones, as
// a model keeps its norms): each chunk's working weights are its master
// weights in its own type, the run is the same bits with the states and
// activations in RAM or on NVMe, with micro-batches, and from a checkpoint,
// which a session of other types refuses by name.
TEST(Session, ChunksOfTheirOwnTypeGiveTheSameBitsOnEveryPlacement) {
  const Mlp m{64, 6, 8};
  const LayerTypes odd_fp32 = [](int64_t l) { return l % 2 == 1 ? std::optional(DType::kF32) : std::nullopt; };
  const SessionOptions o = base_options();
  const std::vector<float> mixed = run(m, o, 12, nullptr, odd_fp32);
  const std::vector<float> bf16 = run(m, o, 12);
  ASSERT_EQ(mixed.size(), 12u);
  ASSERT_EQ(bf16.size(), 12u);
  auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> b;
    for (float f : v) b.push_back(std::bit_cast<uint32_t>(f));
    return b;
  };
  EXPECT_NE(bits(mixed), bits(bf16)) << "the fp32 layers compute with other bits than bf16 ones";
  EXPECT_LT(mixed[8] + mixed[9] + mixed[10] + mixed[11], mixed[0] + mixed[1] + mixed[2] + mixed[3]);

  // In its own type: fp32 chunks are the master bits, bf16 ones their rounding.
  Result<std::unique_ptr<Session>> s = make_session(m, o, odd_fp32);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(train_step(**s, m, k).has_value());
  std::vector<float> master(static_cast<size_t>(m.chunk_elems()));
  for (size_t c = 0; c < (*s)->chunks(); ++c) {
    const DType t = (*s)->chunk_dtype(c);
    EXPECT_EQ(t, c % 2 == 1 ? DType::kF32 : DType::kBF16);
    ASSERT_TRUE((*s)->read_master(c, master).ok());
    ASSERT_TRUE((*s)->begin_step().ok());
    Result<const void*> w = (*s)->acquire(c);
    ASSERT_TRUE(w.has_value()) << w.status().to_string();
    for (size_t i = 0; i < master.size(); ++i) {
      const float want = t == DType::kF32 ? master[i] : bf16_to_f32(f32_to_bf16(master[i]));
      ASSERT_EQ(std::bit_cast<uint32_t>(w_at(*w, t, static_cast<int64_t>(i))), std::bit_cast<uint32_t>(want))
          << "chunk " << c << " element " << i;
    }
    ASSERT_TRUE((*s)->release(c).ok());
    ASSERT_TRUE((*s)->cancel_step().ok());
  }
  // Each fp32 chunk holds 2 more bytes a parameter in its weights and 2 in its gradient.
  Result<std::unique_ptr<Session>> plain = make_session(m, o);
  ASSERT_TRUE(plain.has_value());
  ASSERT_TRUE((*plain)->start().ok());
  EXPECT_EQ((*s)->host_bytes(), (*plain)->host_bytes() + static_cast<uint64_t>(m.L / 2 * m.chunk_elems()) * 4);

  // States and activations on NVMe through a small device.
  TempDir dir;
  SessionOptions nvme = o;
  nvme.states = Tier::kNvme;
  nvme.activations = Tier::kNvme;
  nvme.nvme_paths = {dir.path()};
  nvme.device_bytes = model_state_bytes(m) / 4;  // bf16 model states: its fp32 slots take more
  Result<std::unique_ptr<Session>> n = make_session(m, nvme, odd_fp32);
  ASSERT_TRUE(n.has_value()) << n.status().to_string();
  for (size_t k = 0; k < mixed.size(); ++k) {
    Result<float> loss = train_step(**n, m, static_cast<int64_t>(k), nullptr, /*offload=*/true);
    ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(mixed[k])) << "step " << k;
  }

  // Micro-batches, in RAM and on NVMe, with the delayed update off and on.
  for (bool delayed : {false, true}) {
    std::vector<std::vector<float>> runs;
    for (SessionOptions p : {o, nvme}) {
      p.grad_accum = 2;
      p.delayed_update = delayed;
      Result<std::unique_ptr<Session>> a = make_session(m, p, odd_fp32);
      ASSERT_TRUE(a.has_value()) << a.status().to_string();
      runs.emplace_back();
      for (int k = 0; k < 6; ++k) {
        Result<float> loss = accumulated_step(**a, m, k);
        ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
        runs.back().push_back(*loss);
      }
    }
    EXPECT_EQ(bits(runs[0]), bits(runs[1])) << (delayed ? "delayed update" : "");
  }

  // A checkpoint of step 3 resumes bit for bit; another session's types are refused by name.
  TempDir ckpt;
  Result<std::unique_ptr<Session>> first = make_session(m, o, odd_fp32);
  ASSERT_TRUE(first.has_value());
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(train_step(**first, m, k).has_value());
  ASSERT_TRUE((*first)->save(ckpt.path()).ok());
  Result<std::unique_ptr<Session>> resumed = make_session(m, nvme, odd_fp32);
  ASSERT_TRUE(resumed.has_value());
  Status loaded = (*resumed)->load(ckpt.path());
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  for (int k = 3; k < 12; ++k) {
    Result<float> loss = train_step(**resumed, m, k);
    ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(mixed[static_cast<size_t>(k)])) << "step " << k;
  }
  Result<std::unique_ptr<Session>> other = make_session(m, o);
  ASSERT_TRUE(other.has_value());
  Status refused = (*other)->load(ckpt.path());
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_NE(refused.message().find("\"dtype\":\"fp32\""), std::string::npos) << refused.to_string();
}

// A chunk's own type: fp16 only in an fp16 session, and chunks off the
// precision keep their weights and gradients in RAM.
TEST(Session, AChunksOwnTypeIsRefusedWhereItCannotLive) {
  const Mlp m{16, 2, 4};
  Result<std::unique_ptr<Session>> s = Session::create(base_options());
  ASSERT_TRUE(s.has_value());
  Result<size_t> fp16 = (*s)->add_chunk("half", 8, nullptr, DType::kF16);
  EXPECT_EQ(fp16.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fp16.status().message().find("fp16 session"), std::string::npos) << fp16.status().to_string();
  EXPECT_EQ((*s)->chunks(), 0u);
  // Set after registering: the same rules, nothing changed by a refusal,
  // nothing changed after start.
  ASSERT_TRUE((*s)->add_chunk("w", 8, nullptr).has_value());
  EXPECT_EQ((*s)->set_chunk_dtype(0, DType::kF16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->set_chunk_dtype(1, DType::kF32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->chunk_dtype(0), DType::kBF16);
  EXPECT_TRUE((*s)->set_chunk_dtype(0, DType::kF32).ok());
  EXPECT_EQ((*s)->chunk_dtype(0), DType::kF32);
  ASSERT_TRUE((*s)->start().ok());
  EXPECT_EQ((*s)->set_chunk_dtype(0, DType::kBF16).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*s)->chunk_dtype(0), DType::kF32);

  TempDir dir;
  SessionOptions on_nvme = weights_on_nvme(dir.path());
  SessionOptions grads = base_options();
  grads.states = Tier::kNvme;
  grads.gradients = Tier::kNvme;
  grads.nvme_paths = {dir.path()};
  for (const SessionOptions& o : {on_nvme, grads}) {
    Result<std::unique_ptr<Session>> n =
        make_session(m, o, [](int64_t l) { return l == 1 ? std::optional(DType::kF32) : std::nullopt; });
    ASSERT_TRUE(n.has_value()) << n.status().to_string();
    Status started = (*n)->start();
    EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.to_string();
    EXPECT_NE(started.message().find("\"layer1\" computes in fp32"), std::string::npos) << started.to_string();
    EXPECT_FALSE((*n)->started());
  }
}

// resident_first: the first chunk stays on the device through each step
// (used at both ends, as a model's embeddings are). The same bits as when
// it streams with the rest, in RAM and on NVMe with micro-batches, and it
// goes up once a step instead of at both ends.
TEST(Session, AResidentFirstChunkGivesTheSameBitsAndGoesUpOnce) {
  const Mlp m{64, 8, 8};
  constexpr int kSteps = 6;
  TempDir dir;
  for (bool nvme : {false, true}) {
    SessionOptions o = base_options();
    o.grad_accum = 2;
    if (nvme) {
      o.states = o.weights = o.activations = Tier::kNvme;
      o.nvme_paths = {dir.path()};
    }
    std::vector<float> losses[2];
    uint64_t h2d[2] = {0, 0};
    for (int resident = 0; resident < 2; ++resident) {
      o.resident_first = resident == 1;
      Result<std::unique_ptr<Session>> s = make_session(m, o);
      ASSERT_TRUE(s.has_value()) << s.status().to_string();
      for (int k = 0; k < kSteps; ++k) {
        Result<float> loss = accumulated_step(**s, m, k, /*offload=*/nvme);
        ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
        losses[resident].push_back(*loss);
      }
      h2d[resident] = (*s)->counters().h2d_bytes;
      if (resident == 1) {
        EXPECT_EQ((*s)->residency(0, View::kWeights), Residency::kOnDevice);
      }
    }
    for (int k = 0; k < kSteps; ++k) {
      EXPECT_EQ(std::bit_cast<uint32_t>(losses[0][static_cast<size_t>(k)]),
                std::bit_cast<uint32_t>(losses[1][static_cast<size_t>(k)]))
          << (nvme ? "on NVMe" : "in RAM") << ", step " << k;
    }
    // Per step the streamed chunk 0 goes up for each micro-batch's forward
    // and backward (4 times); resident, once.
    const uint64_t chunk_bytes = static_cast<uint64_t>(m.chunk_elems()) * 2;
    EXPECT_EQ(h2d[0] - h2d[1], static_cast<uint64_t>(kSteps) * 3 * chunk_bytes) << (nvme ? "on NVMe" : "in RAM");
  }
  // One chunk has nothing to stream beside it.
  SessionOptions o = base_options();
  o.resident_first = true;
  Result<std::unique_ptr<Session>> one = Session::create(o);
  ASSERT_TRUE(one.has_value());
  ASSERT_TRUE((*one)->add_chunk("only", 64, {}).has_value());
  const Status started = (*one)->start();
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(started.message().find("at least two chunks"), std::string::npos) << started.to_string();
}

// The vertical order (every micro-batch of a layer while it is on the
// device) gives the same bits as one micro-batch after another, and moves
// the weights once a pass: the session adds each chunk's gradients in the
// order they come, whichever order the model runs.
TEST(Session, TheVerticalOrderGivesTheSameBitsAndMovesTheWeightsOnce) {
  const Mlp m{64, 8, 8};
  constexpr int kSteps = 6;
  SessionOptions o = base_options();
  o.grad_accum = 3;
  Result<std::unique_ptr<Session>> one_by_one = make_session(m, o);
  Result<std::unique_ptr<Session>> vertical = make_session(m, o);
  ASSERT_TRUE(one_by_one.has_value() && vertical.has_value());
  for (int k = 0; k < kSteps; ++k) {
    Result<float> a = accumulated_step(**one_by_one, m, k);
    Result<float> b = vertical_step(**vertical, m, k);
    ASSERT_TRUE(a.has_value()) << a.status().to_string();
    ASSERT_TRUE(b.has_value()) << b.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*a), std::bit_cast<uint32_t>(*b)) << "step " << k << ": " << *a << " vs " << *b;
  }
  std::vector<float> wa(static_cast<size_t>(m.chunk_elems())), wb(wa.size());
  for (size_t c = 0; c < static_cast<size_t>(m.L); ++c) {
    ASSERT_TRUE((*one_by_one)->read_master(c, wa).ok());
    ASSERT_TRUE((*vertical)->read_master(c, wb).ok());
    EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * 4)) << "chunk " << c;
  }
  EXPECT_LT((*vertical)->counters().h2d_bytes, (*one_by_one)->counters().h2d_bytes / 2)
      << "the vertical order should copy the weights up once a pass, not once a micro-batch";
}

// Gradients on NVMe: a ring of host buffers instead of one per chunk, each
// gradient written beside its chunk's states and read back by an update
// after the verdict (clipping fires on the first steps here, so some
// speculative updates are redone from the gradients on NVMe). The same bits
// and verdicts as gradients in RAM, with a ring of one buffer and of three,
// one micro-batch a step and three in the vertical order.
TEST(Session, GradientsOnNvmeGiveTheSameBitsFromARingOfBuffers) {
  const Mlp m{64, 8, 8};
  constexpr int kSteps = 8;
  TempDir dir;
  SessionOptions o = base_options();
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.clip_norm = 0.05f;
  std::vector<StepVerdict> host_v;
  const std::vector<float> host = run(m, o, kSteps, &host_v);
  for (int buffers : {1, 3}) {
    SessionOptions g = o;
    g.gradients = Tier::kNvme;
    g.gradient_buffers = buffers;
    std::vector<StepVerdict> ring_v;
    const std::vector<float> ring = run(m, g, kSteps, &ring_v);
    ASSERT_EQ(ring.size(), host.size()) << buffers << " buffers";
    int redone = 0;
    for (size_t k = 0; k < host.size(); ++k) {
      EXPECT_EQ(std::bit_cast<uint32_t>(host[k]), std::bit_cast<uint32_t>(ring[k])) << "step " << k;
      EXPECT_EQ(host_v[k].grad_norm, ring_v[k].grad_norm) << "step " << k;
      EXPECT_EQ(host_v[k].clipped, ring_v[k].clipped) << "step " << k;
      redone += ring_v[k].rolled_back ? 1 : 0;
    }
    EXPECT_GT(redone, 0) << "some update should have read its gradients back from NVMe";
  }
  // Host memory: the ring (and the staging buffers' room for a gradient)
  // holds a few chunks' gradients, not every chunk's: of 32 chunks, 3 + 4.
  const Mlp deep{64, 32, 8};
  Result<std::unique_ptr<Session>> in_ram = make_session(deep, o);
  SessionOptions g = o;
  g.gradients = Tier::kNvme;
  Result<std::unique_ptr<Session>> on_nvme = make_session(deep, g);
  ASSERT_TRUE(in_ram.has_value() && on_nvme.has_value());
  ASSERT_TRUE((*in_ram)->start().ok() && (*on_nvme)->start().ok());
  const uint64_t all_grads = static_cast<uint64_t>(deep.L * deep.chunk_elems()) * 2;
  EXPECT_LT((*on_nvme)->host_bytes() + all_grads / 2, (*in_ram)->host_bytes())
      << "the ring should replace a gradient buffer per chunk";
  // Accumulating in the vertical order: the fp32 sums wait in a ring too.
  o.grad_accum = 3;
  g.grad_accum = 3;
  Result<std::unique_ptr<Session>> a = make_session(m, o);
  Result<std::unique_ptr<Session>> b = make_session(m, g);
  ASSERT_TRUE(a.has_value() && b.has_value());
  for (int k = 0; k < 4; ++k) {
    Result<float> la = vertical_step(**a, m, k);
    Result<float> lb = vertical_step(**b, m, k);
    ASSERT_TRUE(la.has_value()) << la.status().to_string();
    ASSERT_TRUE(lb.has_value()) << lb.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*la), std::bit_cast<uint32_t>(*lb)) << "step " << k;
  }
}

// With the gradients on NVMe they come in the gradient order, a chunk's
// micro-batches one after another: anything else is refused, naming what
// comes next, and changes nothing (the step then completes as a clean one).
TEST(Session, GradientsOnNvmeComeInTheGradientOrder) {
  const Mlp m{16, 3, 4};
  TempDir dir;
  SessionOptions o = base_options();
  o.states = o.gradients = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  o.gradient_buffers = 1;
  Result<std::unique_ptr<Session>> made = make_session(m, o);
  ASSERT_TRUE(made.has_value()) << made.status().to_string();
  Session& s = **made;
  EXPECT_EQ(s.set_gradient_order({0, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set_gradient_order({0, 1, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set_gradient_order({0, 1, 3}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.set_gradient_order({2, 1, 0}).ok());
  ASSERT_TRUE(s.begin_step().ok());
  EXPECT_EQ(s.set_gradient_order({2, 1, 0}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.gradient_buffer(1).has_value());
  const Status early = s.submit_gradient(1);
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("\"layer2\" next"), std::string::npos) << early.to_string();
  EXPECT_EQ(s.submitted(1), 0);
  ASSERT_TRUE(s.cancel_step().ok());
  ASSERT_TRUE(train_step(s, m, 0).has_value());
  SessionOptions r = o;
  r.states = r.gradients = Tier::kHost;
  const std::vector<float> want = run(m, r, 2);
  Result<float> second = train_step(s, m, 1);
  ASSERT_TRUE(second.has_value()) << second.status().to_string();
  EXPECT_EQ(std::bit_cast<uint32_t>(*second), std::bit_cast<uint32_t>(want[1]));
  // Micro-batch by micro-batch, every chunk's first gradient before any
  // chunk's second: the ring cannot hold that.
  o.grad_accum = 2;
  Result<std::unique_ptr<Session>> acc = make_session(m, o);
  ASSERT_TRUE(acc.has_value()) << acc.status().to_string();
  ASSERT_TRUE((*acc)->begin_step(0.5f).ok());
  Result<float> mb = micro_batch(**acc, m, 0, false);
  ASSERT_FALSE(mb.has_value());
  EXPECT_EQ(mb.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(mb.status().message().find("one after another"), std::string::npos) << mb.status().to_string();
  EXPECT_EQ((*acc)->submitted(1), 0);
  EXPECT_EQ((*acc)->submitted(2), 1);
  // States in RAM cannot take them.
  SessionOptions bad = base_options();
  bad.gradients = Tier::kNvme;
  EXPECT_NE(Session::create(bad).status().message().find("gradients on NVMe need"), std::string::npos);
}

// The delayed update: step t+1 computes with the weights from before
// update t. Deterministic — the same bits in RAM and with the weights,
// states and saved activations on NVMe through a capped device — but
// not the exact schedule's numbers; each end_step returns the verdict of the
// step before it; read_master lands the update in flight.
TEST(Session, TheDelayedUpdateIsOneStepStaleAndTheSameOnEveryPlacement) {
  const Mlp m{64, 8, 8};
  constexpr int kSteps = 10;
  SessionOptions o = base_options();
  o.clip_norm = 0.05f;
  const std::vector<float> exact = run(m, o, kSteps);
  o.delayed_update = true;
  std::vector<StepVerdict> verdicts;
  const std::vector<float> ram = run(m, o, kSteps, &verdicts);
  ASSERT_EQ(ram.size(), exact.size());
  // Step 1 computes with the initial weights either way; step 2 still does
  // when delayed (update 1 runs beside it).
  EXPECT_EQ(std::bit_cast<uint32_t>(ram[0]), std::bit_cast<uint32_t>(exact[0]));
  EXPECT_NE(std::bit_cast<uint32_t>(ram[1]), std::bit_cast<uint32_t>(exact[1]));
  for (size_t k = 0; k < verdicts.size(); ++k) EXPECT_EQ(verdicts[k].step, static_cast<int64_t>(k)) << "step " << k;
  TempDir dir;
  SessionOptions n = weights_on_nvme(dir.path());
  n.clip_norm = o.clip_norm;
  n.delayed_update = true;
  n.activations = Tier::kNvme;
  n.device_bytes = model_state_bytes(m) / 10;
  Result<std::unique_ptr<Session>> s = make_session(m, n);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  for (int k = 0; k < kSteps; ++k) {
    StepVerdict v;
    Result<float> loss = train_step(**s, m, k, &v, /*offload=*/true);
    ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(ram[static_cast<size_t>(k)])) << "step " << k;
    EXPECT_EQ(v.grad_norm, verdicts[static_cast<size_t>(k)].grad_norm) << "step " << k;
    EXPECT_EQ(v.clipped, verdicts[static_cast<size_t>(k)].clipped) << "step " << k;
  }
  // read_master lands update 10: the master weights then equal those of a
  // run in RAM after the same ten steps and its own landing.
  Result<std::unique_ptr<Session>> r = make_session(m, o);
  ASSERT_TRUE(r.has_value());
  for (int k = 0; k < kSteps; ++k) ASSERT_TRUE(train_step(**r, m, k).has_value());
  std::vector<float> a(static_cast<size_t>(m.chunk_elems())), b(a.size());
  for (size_t c = 0; c < static_cast<size_t>(m.L); ++c) {
    ASSERT_TRUE((*s)->read_master(c, a).ok());
    ASSERT_TRUE((*r)->read_master(c, b).ok());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "chunk " << c;
  }
}

// Accumulating with the delayed update: the micro-batches' sums are made
// beside the compute and the update takes them at end_step; one by one and
// in the vertical order, the same bits.
TEST(Session, TheDelayedUpdateAccumulatesTheSameInEitherOrder) {
  const Mlp m{64, 8, 8};
  SessionOptions o = base_options();
  o.grad_accum = 3;
  o.delayed_update = true;
  Result<std::unique_ptr<Session>> a = make_session(m, o);
  Result<std::unique_ptr<Session>> b = make_session(m, o);
  SessionOptions x = o;
  x.delayed_update = false;
  Result<std::unique_ptr<Session>> exact = make_session(m, x);
  ASSERT_TRUE(a.has_value() && b.has_value() && exact.has_value());
  bool differs = false;
  for (int k = 0; k < 6; ++k) {
    Result<float> la = accumulated_step(**a, m, k);
    Result<float> lb = vertical_step(**b, m, k);
    Result<float> lx = accumulated_step(**exact, m, k);
    ASSERT_TRUE(la.has_value() && lb.has_value() && lx.has_value());
    EXPECT_EQ(std::bit_cast<uint32_t>(*la), std::bit_cast<uint32_t>(*lb)) << "step " << k;
    differs = differs || *la != *lx;
  }
  EXPECT_TRUE(differs) << "the delayed update should not be the exact schedule";
}

// A delayed update that fails (NVMe writes refused) fails the end_step
// that waits for it, with nothing of that step kept; the next begin_step
// begins it again, and the run goes on with the bits of one never failed.
// (read_master after step 2 lands the update in flight in both runs, so
// the only writes after it are update 3's.)
TEST(Session, AFailedDelayedUpdateIsBegunAgainWithTheSameNumbers) {
  const Mlp m{32, 4, 16};
  TempDir clean_dir, faulty_dir;
  SessionOptions o = base_options();
  o.states = Tier::kNvme;
  o.delayed_update = true;
  std::vector<float> master(static_cast<size_t>(m.chunk_elems()));
  auto steps = [&](Session& s, int from, int to, std::vector<float>* losses) {
    for (int k = from; k < to; ++k) {
      Result<float> loss = train_step(s, m, k);
      ASSERT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
      losses->push_back(*loss);
    }
  };
  o.nvme_paths = {clean_dir.path()};
  Result<std::unique_ptr<Session>> clean = make_session(m, o);
  ASSERT_TRUE(clean.has_value()) << clean.status().to_string();
  std::vector<float> want, got;
  steps(**clean, 0, 2, &want);
  ASSERT_TRUE((*clean)->read_master(0, master).ok());
  steps(**clean, 2, 6, &want);
  o.nvme_paths = {faulty_dir.path()};
  o.faults = io::FaultConfig{};
  Result<std::unique_ptr<Session>> made = make_session(m, o);
  ASSERT_TRUE(made.has_value()) << made.status().to_string();
  Session& s = **made;
  steps(s, 0, 2, &got);
  ASSERT_TRUE(s.read_master(0, master).ok());
  s.swap_store()->faults()->fail_next(io::IoOp::kWrite, EIO, 1000);
  steps(s, 2, 3, &got);  // begins update 3, which fails beside nothing
  Result<float> failed = train_step(s, m, 3);
  ASSERT_FALSE(failed.has_value());
  EXPECT_NE(failed.status().message().find("delayed update of step 3"), std::string::npos)
      << failed.status().to_string();
  EXPECT_EQ(s.steps_done(), 3);
  EXPECT_EQ(s.async_error().code(), StatusCode::kUnavailable);
  s.swap_store()->faults()->clear_forced();
  steps(s, 3, 6, &got);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[k]), std::bit_cast<uint32_t>(want[k])) << "step " << k;
  }
  EXPECT_TRUE(s.finalize().ok());
}

TEST(Session, Fp16SkipsAnOverflowAndKeepsTheWeights) {
  const Mlp m{16, 2, 4};
  SessionOptions o = base_options();
  o.precision = DType::kF16;
  o.loss_scale.initial_power = 30;  // 2^30: the first gradients overflow fp16
  o.loss_scale.hysteresis = 1;      // and the first overflow halves the scale
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  std::vector<float> before(static_cast<size_t>(m.chunk_elems()));
  ASSERT_TRUE((*s)->start().ok());
  ASSERT_TRUE((*s)->read_master(0, before).ok());
  StepVerdict v;
  ASSERT_TRUE(train_step(**s, m, 0, &v).has_value());
  EXPECT_TRUE(v.skipped);
  EXPECT_LT(v.loss_scale, std::ldexp(1.0, 30));
  std::vector<float> after(before.size());
  ASSERT_TRUE((*s)->read_master(0, after).ok());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
}

// The caller's loss scale between steps (fp16): a session told 2^8 before
// its first step gives the bits of one that began at 2^8, where its own
// start (2^30) would have overflowed; the dynamic scaler goes on from it.
// Bad scales and a scale inside a step are refused, changing nothing.
TEST(Session, TheCallerSetsTheLossScaleBetweenSteps) {
  const Mlp m{16, 2, 4};
  SessionOptions o = base_options();
  o.precision = DType::kF16;
  o.loss_scale.initial_power = 30;
  o.loss_scale.hysteresis = 1;
  SessionOptions at8 = o;
  at8.loss_scale.initial_power = 8;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  Result<std::unique_ptr<Session>> want = make_session(m, at8);
  ASSERT_TRUE(s.has_value() && want.has_value());
  for (double bad : {3.0, 0.5, 0.0, -4.0, std::nan(""), std::ldexp(1.0, 128)}) {
    EXPECT_EQ((*s)->set_loss_scale(bad).code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ((*s)->loss_scale(), std::ldexp(1.0, 30)) << bad;
  }
  ASSERT_TRUE((*s)->set_loss_scale(256).ok());
  EXPECT_EQ((*s)->loss_scale(), 256.0);
  for (int k = 0; k < 3; ++k) {
    StepVerdict got, expected;
    Result<float> a = train_step(**s, m, k, &got);
    Result<float> b = train_step(**want, m, k, &expected);
    ASSERT_TRUE(a.has_value() && b.has_value()) << "step " << k;
    EXPECT_FALSE(got.skipped) << "step " << k;
    EXPECT_EQ(std::bit_cast<uint32_t>(*a), std::bit_cast<uint32_t>(*b)) << "step " << k;
    EXPECT_EQ(got.loss_scale, expected.loss_scale) << "step " << k;
  }
  for (size_t c = 0; c < (*s)->chunks(); ++c) {
    std::vector<float> x(static_cast<size_t>(m.chunk_elems())), y(x.size());
    ASSERT_TRUE((*s)->read_master(c, x).ok() && (*want)->read_master(c, y).ok());
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4)) << "chunk " << c;
  }
  ASSERT_TRUE((*s)->begin_step().ok());
  EXPECT_EQ((*s)->set_loss_scale(64).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*s)->loss_scale(), 256.0);
  ASSERT_TRUE((*s)->cancel_step().ok());
  // A bf16 session scales nothing: 1 is its scale, anything else refused.
  Result<std::unique_ptr<Session>> bf16 = make_session(m, base_options());
  ASSERT_TRUE(bf16.has_value());
  EXPECT_TRUE((*bf16)->set_loss_scale(1).ok());
  EXPECT_EQ((*bf16)->set_loss_scale(2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*bf16)->loss_scale(), 1.0);
}

class SessionMisuse : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Session>> s = make_session(m_, base_options());
    ASSERT_TRUE(s.has_value()) << s.status().to_string();
    s_ = std::move(*s);
    ASSERT_TRUE(s_->start().ok());
    master0_.resize(static_cast<size_t>(m_.chunk_elems()));
    ASSERT_TRUE(s_->read_master(0, master0_).ok());
  }
  // Nothing changed: a whole step still runs and updates chunk 0.
  void expect_a_step_still_runs() {
    if (s_->in_step()) {
      ASSERT_TRUE(s_->cancel_step().ok());
    }
    std::vector<float> now(master0_.size());
    ASSERT_TRUE(s_->read_master(0, now).ok());
    EXPECT_EQ(0, std::memcmp(now.data(), master0_.data(), now.size() * 4)) << "a refused call changed the weights";
    Result<float> loss = train_step(*s_, m_, 0);
    ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
    EXPECT_EQ(s_->steps_done(), 1);
  }
  Mlp m_{16, 3, 4};
  std::unique_ptr<Session> s_;
  std::vector<float> master0_;
};

TEST_F(SessionMisuse, AnUnknownChunkIsInvalidArgument) {
  ASSERT_TRUE(s_->begin_step().ok());
  EXPECT_EQ(s_->acquire(3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s_->gradient_buffer(99).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s_->submit_gradient(3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s_->release(7).code(), StatusCode::kInvalidArgument);
  expect_a_step_still_runs();
}

TEST_F(SessionMisuse, CallsOutsideAStepAreFailedPrecondition) {
  EXPECT_EQ(s_->gradient_buffer(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s_->submit_gradient(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s_->release(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s_->end_step().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s_->begin_step().ok());
  EXPECT_EQ(s_->begin_step().code(), StatusCode::kFailedPrecondition);
  expect_a_step_still_runs();
}

TEST_F(SessionMisuse, AGradientSubmittedTwiceIsRefused) {
  ASSERT_TRUE(s_->begin_step().ok());
  ASSERT_TRUE(s_->gradient_buffer(2).has_value());
  ASSERT_TRUE(s_->submit_gradient(2).ok());
  const Status again = s_->submit_gradient(2);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("submitted twice"), std::string::npos) << again.to_string();
  // Its weights are being updated: acquiring them again is refused too.
  EXPECT_EQ(s_->acquire(2).status().code(), StatusCode::kFailedPrecondition);
  expect_a_step_still_runs();
}

// With micro-batches: a chunk is acquired and computed again after an
// earlier micro-batch's submit, but not after its last; a step ended early
// says how many micro-batches each chunk is missing; a submit past
// grad_accum is refused. None of it changes anything.
TEST(SessionMisuseAccumulating, MicroBatchesAreCountedPerChunk) {
  const Mlp m{16, 3, 4};
  SessionOptions o = base_options();
  o.grad_accum = 2;
  Result<std::unique_ptr<Session>> made = make_session(m, o);
  ASSERT_TRUE(made.has_value()) << made.status().to_string();
  Session& s = **made;
  ASSERT_TRUE(s.start().ok());
  std::vector<float> master0(static_cast<size_t>(m.chunk_elems()));
  ASSERT_TRUE(s.read_master(0, master0).ok());
  ASSERT_TRUE(s.begin_step(0.5f).ok());
  ASSERT_TRUE(micro_batch(s, m, 0, false).has_value());
  EXPECT_EQ(s.submitted(1), 1);
  const Status early = s.end_step().status();
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("\"layer1\" (1 of 2 micro-batches)"), std::string::npos) << early.to_string();
  ASSERT_TRUE(micro_batch(s, m, 1, false).has_value());  // chunks acquired and computed again
  EXPECT_EQ(s.submitted(1), 2);
  EXPECT_EQ(s.acquire(1).status().code(), StatusCode::kFailedPrecondition);  // its update may run
  EXPECT_EQ(s.gradient_buffer(1).status().code(), StatusCode::kFailedPrecondition);
  const Status third = s.submit_gradient(1);
  EXPECT_EQ(third.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(third.message().find("more than grad_accum = 2"), std::string::npos) << third.to_string();
  // Every gradient in: the update is under way, so the step cannot be cancelled.
  EXPECT_EQ(s.cancel_step().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.end_step().has_value());
  // The refused calls changed nothing: the same master weights as a clean step.
  Result<std::unique_ptr<Session>> clean = make_session(m, o);
  ASSERT_TRUE(clean.has_value()) << clean.status().to_string();
  ASSERT_TRUE(accumulated_step(**clean, m, 0).has_value());
  std::vector<float> now(master0.size()), want(master0.size());
  ASSERT_TRUE(s.read_master(0, now).ok());
  ASSERT_TRUE((*clean)->read_master(0, want).ok());
  EXPECT_EQ(0, std::memcmp(now.data(), want.data(), now.size() * 4));
  EXPECT_NE(0, std::memcmp(now.data(), master0.data(), now.size() * 4)) << "a whole step should update";
}

// A step part way (some micro-batches in) is cancelled with nothing applied.
TEST(SessionMisuseAccumulating, ACancelledStepPartWayChangesNothing) {
  const Mlp m{16, 3, 4};
  SessionOptions o = base_options();
  o.grad_accum = 3;
  Result<std::unique_ptr<Session>> made = make_session(m, o);
  ASSERT_TRUE(made.has_value()) << made.status().to_string();
  Session& s = **made;
  ASSERT_TRUE(s.start().ok());
  std::vector<float> master0(static_cast<size_t>(m.chunk_elems())), now(master0.size());
  ASSERT_TRUE(s.read_master(0, master0).ok());
  ASSERT_TRUE(s.begin_step(1.0f / 3).ok());
  ASSERT_TRUE(micro_batch(s, m, 0, false).has_value());
  ASSERT_TRUE(micro_batch(s, m, 1, false).has_value());
  ASSERT_TRUE(s.cancel_step().ok());
  ASSERT_TRUE(s.read_master(0, now).ok());
  EXPECT_EQ(0, std::memcmp(now.data(), master0.data(), now.size() * 4)) << "a cancelled step changed the weights";
  // And the next step starts its sums afresh: the bits of a clean session's first step.
  ASSERT_TRUE(accumulated_step(s, m, 0).has_value());
  Result<std::unique_ptr<Session>> clean = make_session(m, o);
  ASSERT_TRUE(clean.has_value()) << clean.status().to_string();
  ASSERT_TRUE(accumulated_step(**clean, m, 0).has_value());
  std::vector<float> want(master0.size());
  ASSERT_TRUE(s.read_master(0, now).ok());
  ASSERT_TRUE((*clean)->read_master(0, want).ok());
  EXPECT_EQ(0, std::memcmp(now.data(), want.data(), now.size() * 4));
}

// Once every gradient is in, the update runs (in RAM, in place): the step
// can no longer be cancelled, only ended, and the refusal changes nothing.
TEST_F(SessionMisuse, CancellingAfterEveryGradientIsRefused) {
  ASSERT_TRUE(s_->begin_step().ok());
  for (size_t c = static_cast<size_t>(m_.L); c-- > 0;) {
    ASSERT_TRUE(s_->gradient_buffer(c).has_value());
    ASSERT_TRUE(s_->submit_gradient(c).ok());
  }
  const Status cancel = s_->cancel_step();
  EXPECT_EQ(cancel.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cancel.message().find("end_step"), std::string::npos) << cancel.to_string();
  EXPECT_TRUE(s_->in_step());
  ASSERT_TRUE(s_->end_step().has_value());
  EXPECT_EQ(s_->steps_done(), 1);
}

TEST_F(SessionMisuse, ASubmitWithoutAGradientIsRefused) {
  ASSERT_TRUE(s_->begin_step().ok());
  EXPECT_EQ(s_->submit_gradient(1).code(), StatusCode::kFailedPrecondition);
  expect_a_step_still_runs();
}

TEST_F(SessionMisuse, EndingAStepWithGradientsMissingNamesThemAndKeepsItOpen) {
  ASSERT_TRUE(s_->begin_step().ok());
  ASSERT_TRUE(s_->gradient_buffer(2).has_value());
  ASSERT_TRUE(s_->submit_gradient(2).ok());
  const Result<StepVerdict> v = s_->end_step();
  ASSERT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("\"layer0\", \"layer1\""), std::string::npos) << v.status().to_string();
  EXPECT_TRUE(s_->in_step());
  // The rest submitted, the step ends.
  for (size_t c : {1u, 0u}) {
    ASSERT_TRUE(s_->gradient_buffer(c).has_value());
    ASSERT_TRUE(s_->submit_gradient(c).ok());
  }
  EXPECT_TRUE(s_->end_step().has_value());
  EXPECT_EQ(s_->steps_done(), 1);
}

TEST_F(SessionMisuse, ReleasingWhatIsNotHeldOrHoldingMoreThanTheSlotsIsRefused) {
  ASSERT_TRUE(s_->begin_step().ok());
  ASSERT_TRUE(s_->acquire(0).has_value());
  ASSERT_TRUE(s_->acquire(0).has_value());  // held twice (a weight's second use): no second slot
  EXPECT_EQ(s_->release(1).code(), StatusCode::kFailedPrecondition);
  // Holding more chunks than the slots: refused before anything moves.
  ASSERT_TRUE(s_->acquire(1).has_value());
  EXPECT_EQ(s_->acquire(2).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(s_->release(0).ok());
  ASSERT_TRUE(s_->release(0).ok());
  EXPECT_EQ(s_->release(0).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s_->release(1).ok());
  expect_a_step_still_runs();
}

TEST_F(SessionMisuse, AThirdGradientBufferBeforeASubmitIsRefused) {
  ASSERT_TRUE(s_->begin_step().ok());
  ASSERT_TRUE(s_->gradient_buffer(2).has_value());
  ASSERT_TRUE(s_->gradient_buffer(1).has_value());
  const Result<void*> third = s_->gradient_buffer(0);
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted) << third.status().to_string();
  expect_a_step_still_runs();
}

TEST_F(SessionMisuse, ChunksComeBeforeStartWithGoodNamesAndSizes) {
  Result<std::unique_ptr<Session>> s = Session::create(base_options());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ((*s)->add_chunk("", 4, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->add_chunk("a", 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->add_chunk("a", -3, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->start().code(), StatusCode::kFailedPrecondition);  // nothing registered
  ASSERT_TRUE((*s)->add_chunk("a", 4, {}).has_value());
  EXPECT_EQ((*s)->add_chunk("a", 4, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->chunks(), 1u);
  EXPECT_EQ(s_->add_chunk("late", 4, {}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s_->chunks(), 3u);
}

TEST_F(SessionMisuse, TensorsComeBeforeStartInsideTheirChunkUnderNewNames) {
  Result<std::unique_ptr<Session>> s = Session::create(base_options());
  ASSERT_TRUE(s.has_value());
  Session& f = **s;
  ASSERT_TRUE(f.add_chunk("a", 10, {}).has_value());
  EXPECT_EQ(f.add_tensor(1, {"x", 0, {2}}).code(), StatusCode::kInvalidArgument);   // no chunk 1
  EXPECT_EQ(f.add_tensor(0, {"", 0, {2}}).code(), StatusCode::kInvalidArgument);    // no name
  EXPECT_EQ(f.add_tensor(0, {"a", 0, {2}}).code(), StatusCode::kInvalidArgument);   // the chunk's name
  EXPECT_EQ(f.add_tensor(0, {"x", 0, {}}).code(), StatusCode::kInvalidArgument);    // no shape
  EXPECT_EQ(f.add_tensor(0, {"x", 0, {0}}).code(), StatusCode::kInvalidArgument);   // an empty dimension
  EXPECT_EQ(f.add_tensor(0, {"x", 8, {3}}).code(), StatusCode::kInvalidArgument);   // past the end
  EXPECT_EQ(f.add_tensor(0, {"x", -1, {3}}).code(), StatusCode::kInvalidArgument);  // before the start
  ASSERT_TRUE(f.add_tensor(0, {"a.w", 2, {2, 3}}).ok());
  const Status overlap = f.add_tensor(0, {"a.b", 7, {2}});
  EXPECT_EQ(overlap.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.to_string().find("a.w"), std::string::npos) << overlap.to_string();
  EXPECT_EQ(f.add_tensor(0, {"a.w", 0, {1}}).code(), StatusCode::kInvalidArgument);    // the name again
  EXPECT_EQ(f.add_chunk("a.w", 4, {}).status().code(), StatusCode::kInvalidArgument);  // a tensor's name
  EXPECT_TRUE(f.add_tensor(0, {"a.b", 8, {2}}).ok());
  EXPECT_EQ(s_->add_tensor(0, {"late", 0, {1}}).code(), StatusCode::kFailedPrecondition);
  expect_a_step_still_runs();
}

TEST_F(SessionMisuse, AfterAbortEveryCallIsCancelled) {
  ASSERT_TRUE(s_->begin_step().ok());
  s_->abort();
  EXPECT_EQ(s_->acquire(0).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(s_->submit_gradient(0).code(), StatusCode::kCancelled);
  EXPECT_EQ(s_->end_step().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(s_->begin_step().code(), StatusCode::kCancelled);
  EXPECT_EQ(s_->async_error().code(), StatusCode::kCancelled);
}

TEST(Session, BadOptionsAreRefusedNamingTheOption) {
  SessionOptions o = base_options();
  o.states = Tier::kNvme;  // no nvme_paths
  EXPECT_NE(Session::create(o).status().message().find("nvme_paths"), std::string::npos);
  o = base_options();
  o.weights = Tier::kNvme;  // states in RAM
  EXPECT_EQ(Session::create(o).status().code(), StatusCode::kInvalidArgument);
  o = base_options();
  o.precision = DType::kF32;
  o.states = o.weights = Tier::kNvme;  // fp32 working weights stay in RAM
  o.nvme_paths = {"/tmp"};
  EXPECT_NE(Session::create(o).status().message().find("fp32 working weights"), std::string::npos);
  o = base_options();
  o.clip_norm = -1;
  EXPECT_NE(Session::create(o).status().message().find("clip_norm"), std::string::npos);
  for (int bad : {0, -3, 5000}) {
    o = base_options();
    o.grad_accum = bad;
    EXPECT_NE(Session::create(o).status().message().find("grad_accum"), std::string::npos) << bad;
  }
}

// The optimizer's threads and the session's host memory bound to NUMA node
// 0 (as on a GPU server): the same bits; a node the machine lacks is
// refused at create, naming it.
TEST(Session, ANumaNodeGivesTheSameBitsAndAMissingOneIsRefused) {
  const Mlp m{32, 4, 8};
  TempDir dir;
  SessionOptions o = base_options();
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  const std::vector<float> unbound = run(m, o, 4);
  o.numa_node = 0;
  EXPECT_EQ(run(m, o, 4), unbound);
  o.numa_node = 4000;
  Result<std::unique_ptr<Session>> none = Session::create(o);
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.status().message().find("NUMA node 4000"), std::string::npos) << none.status().to_string();
  o.numa_node = -2;
  EXPECT_NE(Session::create(o).status().message().find("numa_node"), std::string::npos);
}

// The verdict says what the step's update moved: with the states and the
// gradients on NVMe, a speculative update that holds reads each chunk's
// state once (12 bytes a parameter) and writes it and its gradient once
// (14) — the logical bytes; the store below moves them padded to its
// alignment, which the session's counters show.
TEST(Session, TheVerdictCountsTheUpdatesNvmeBytes) {
  const Mlp m{32, 4, 8};
  TempDir dir;
  SessionOptions o = base_options();
  o.states = o.gradients = Tier::kNvme;
  o.nvme_paths = {dir.path()};
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  ASSERT_TRUE((*s)->start().ok());
  const auto params = static_cast<uint64_t>(m.L * m.chunk_elems());
  for (int k = 0; k < 3; ++k) {
    const SessionCounters before = (*s)->counters();
    StepVerdict v;
    ASSERT_TRUE(train_step(**s, m, k, &v).has_value());
    const SessionCounters after = (*s)->counters();
    ASSERT_FALSE(v.rolled_back);
    EXPECT_EQ(v.update.nvme_bytes_read, params * 12) << "step " << k;
    EXPECT_EQ(v.update.nvme_bytes_written, params * 14) << "step " << k;
    EXPECT_GE(after.nvme_read_bytes - before.nvme_read_bytes, v.update.nvme_bytes_read) << "step " << k;
    EXPECT_GE(after.nvme_written_bytes - before.nvme_written_bytes, v.update.nvme_bytes_written) << "step " << k;
  }
}

// A session of the MLP with its weights in RAM or on NVMe (prefetch depth
// 2), and the losses of `steps` plain steps of another one like it: what a
// test that drives the first differently must give, bit for bit.
struct SessionAgainstARun {
  std::unique_ptr<Session> session;
  std::vector<float> want;
};
SessionAgainstARun session_against_a_run(const Mlp& m, TempDir& dir, bool nvme, int steps) {
  SessionOptions o = nvme ? weights_on_nvme(dir.sub("w")) : base_options();
  o.prefetch_depth = 2;
  SessionAgainstARun r;
  r.want = run(m, o, steps);
  if (nvme) o.nvme_paths = {dir.sub("w2")};
  Result<std::unique_ptr<Session>> made = make_session(m, o);
  EXPECT_TRUE(made.has_value()) << made.status().to_string();
  if (made.has_value()) r.session = std::move(*made);
  return r;
}

// The first step records the order the chunks are used in, later ones
// prefetch by it; a step that departs from it (here every other step looks
// at the last layer first) costs waiting, never bits — with the weights on
// NVMe too, where the reads ahead were for the wrong chunks.
TEST(Session, AStepOutOfTheRecordedOrderCostsNoBits) {
  const Mlp m{32, 4, 8};
  TempDir dir;
  for (const bool nvme : {false, true}) {
    SCOPED_TRACE(nvme ? "weights on nvme" : "weights in ram");
    SessionAgainstARun r = session_against_a_run(m, dir, nvme, 6);
    ASSERT_TRUE(r.session);
    std::unique_ptr<Session>* s = &r.session;
    const std::vector<float>& want = r.want;
    for (int k = 0; k < 6; ++k) {
      ASSERT_TRUE((*s)->begin_step().ok());
      if (k % 2 == 1) {  // a use the recorded order does not have
        ASSERT_TRUE((*s)->acquire(static_cast<size_t>(m.L - 1)).has_value());
        ASSERT_TRUE((*s)->release(static_cast<size_t>(m.L - 1)).ok());
      }
      Result<float> loss = micro_batch(**s, m, k, false);
      ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
      ASSERT_TRUE((*s)->end_step().has_value());
      EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(want[static_cast<size_t>(k)])) << "step " << k;
    }
  }
}

// A chunk acquired while it is held (a weight used at two points of the
// forward, a module called twice) gives the same weights and stays held
// until as many releases: a step ended before the last one is refused, a
// release too many too; the run's bits are those of single acquires, with
// the weights in RAM and on NVMe.
TEST(Session, AChunkAcquiredAgainWhileHeldIsTheSameWeightsUntilAsManyReleases) {
  const Mlp m{32, 4, 8};
  TempDir dir;
  for (const bool nvme : {false, true}) {
    SCOPED_TRACE(nvme ? "weights on nvme" : "weights in ram");
    SessionAgainstARun r = session_against_a_run(m, dir, nvme, 4);
    ASSERT_TRUE(r.session);
    std::unique_ptr<Session>* s = &r.session;
    const std::vector<float>& want = r.want;
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE((*s)->begin_step().ok());
      const size_t c = 1;
      Result<const void*> first = (*s)->acquire(c);
      ASSERT_TRUE(first.has_value()) << first.status().to_string();
      Result<const void*> again = (*s)->acquire(c);
      ASSERT_TRUE(again.has_value()) << again.status().to_string();
      EXPECT_EQ(*again, *first) << "the same weights";
      ASSERT_TRUE((*s)->release(c).ok());
      Result<const void*> third = (*s)->acquire(c);  // still held: the same again
      ASSERT_TRUE(third.has_value());
      EXPECT_EQ(*third, *first);
      ASSERT_TRUE((*s)->release(c).ok());
      ASSERT_TRUE((*s)->release(c).ok());
      EXPECT_EQ((*s)->release(c).code(), StatusCode::kFailedPrecondition) << "a release too many";
      Result<float> loss = micro_batch(**s, m, k, false);
      ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
      ASSERT_TRUE((*s)->end_step().has_value());
      EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(want[static_cast<size_t>(k)])) << "step " << k;
    }
    // Held twice and released once when the step would end: refused, the step open.
    ASSERT_TRUE((*s)->begin_step().ok());
    ASSERT_TRUE((*s)->acquire(0).has_value());
    ASSERT_TRUE((*s)->acquire(0).has_value());
    ASSERT_TRUE((*s)->release(0).ok());
    for (size_t c = 0; c < static_cast<size_t>(m.L); ++c) {
      ASSERT_TRUE((*s)->gradient_buffer(c).has_value());
      ASSERT_TRUE((*s)->submit_gradient(c).ok());
    }
    Result<StepVerdict> early = (*s)->end_step();
    ASSERT_FALSE(early.has_value());
    EXPECT_NE(early.status().message().find("still acquired"), std::string::npos) << early.status().to_string();
    ASSERT_TRUE((*s)->release(0).ok());
    EXPECT_TRUE((*s)->end_step().has_value());
  }
}

// The MLP's forward outside a step (an evaluation): every layer acquired,
// computed, released. Its output.
Result<std::vector<float>> evaluate(Session& s, const Mlp& m, int64_t index) {
  std::vector<float> x, y;
  batch(m, index, &x, &y);
  const size_t act = static_cast<size_t>(m.B * m.D);
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory acts, s.allocate_device(2 * act * 4, "evaluation"));
  float* h = acts.as<float>();
  std::memcpy(h, x.data(), act * 4);
  for (int64_t l = 0; l < m.L; ++l) {
    STRATA_ASSIGN_OR_RETURN(const void* w, s.acquire(static_cast<size_t>(l)));
    layer_forward(m, l, w, s.chunk_dtype(static_cast<size_t>(l)), h + (l % 2) * act, h + ((l + 1) % 2) * act);
    STRATA_RETURN_IF_ERROR(s.release(static_cast<size_t>(l)));
  }
  const float* out = h + (m.L % 2) * act;
  return std::vector<float>(out, out + act);
}

// Weights read outside a step (evaluation, torch.no_grad()): the same as
// a step's forward reads, before the first step and between steps, with
// the weights in RAM and on NVMe; the training run's bits do not change
// with evaluations between its steps; gradient calls are refused in one,
// and a save or the next step while a chunk is still held for one.
TEST(Session, ChunksAcquiredOutsideAStepAreTheWeightsForEvaluation) {
  const Mlp m{32, 4, 8};
  TempDir dir;
  for (const bool nvme : {false, true}) {
    SCOPED_TRACE(nvme ? "weights on nvme" : "weights in ram");
    SessionAgainstARun r = session_against_a_run(m, dir, nvme, 4);
    ASSERT_TRUE(r.session);
    Session& s = *r.session;
    const std::vector<float>& want = r.want;
    Result<std::vector<float>> before = evaluate(s, m, 99);  // starts the session
    ASSERT_TRUE(before.has_value()) << before.status().to_string();
    for (int k = 0; k < 4; ++k) {
      Result<float> loss = train_step(s, m, k);
      ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
      EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(want[static_cast<size_t>(k)])) << "step " << k;
      Result<std::vector<float>> again = evaluate(s, m, 99);
      ASSERT_TRUE(again.has_value()) << again.status().to_string();
      EXPECT_NE(*again, *before) << "the weights the step updated";
      Result<std::vector<float>> twice = evaluate(s, m, 99);
      ASSERT_TRUE(twice.has_value());
      EXPECT_EQ(*twice, *again) << "reading changes nothing";
    }
    // An evaluation out of the recorded order (if the placement records
    // one) leaves that order to the steps.
    const std::vector<size_t> recorded = s.recorded_order();
    ASSERT_TRUE(s.acquire(static_cast<size_t>(m.L - 1)).has_value());
    ASSERT_TRUE(s.release(static_cast<size_t>(m.L - 1)).ok());
    std::vector<float> master(static_cast<size_t>(m.chunk_elems()));
    ASSERT_TRUE(s.read_master(0, master).ok());  // ends the evaluation
    EXPECT_EQ(s.recorded_order(), recorded);
    // Inside an evaluation: gradients refused, the pass open until every chunk is released.
    ASSERT_TRUE(s.acquire(1).has_value());
    EXPECT_EQ(s.gradient_buffer(1).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.submit_gradient(1).code(), StatusCode::kFailedPrecondition);
    const Status early = s.begin_step();
    EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(early.message().find("still acquired outside a step"), std::string::npos) << early.to_string();
    EXPECT_EQ(s.save(dir.sub(nvme ? "c1" : "c0")).code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(s.release(1).ok());
    Result<float> loss = train_step(s, m, 4);
    ASSERT_TRUE(loss.has_value()) << "after the evaluation: " << loss.status().to_string();
  }
}

TEST(Session, ADeviceBudgetTooSmallForTheSlotsNamesTheBudget) {
  const Mlp m{64, 4, 4};
  SessionOptions o = base_options();
  o.device_bytes = 4096;  // not one chunk's weights
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value());
  const Status started = (*s)->start();
  EXPECT_EQ(started.code(), StatusCode::kResourceExhausted) << started.to_string();
  EXPECT_FALSE((*s)->started());
}

TEST(Session, AHostBudgetBelowTheNeedIsRefusedBeforeAllocating) {
  const Mlp m{64, 4, 4};
  SessionOptions o = base_options();
  o.host_budget_bytes = 1024;
  Result<std::unique_ptr<Session>> s = make_session(m, o);
  ASSERT_TRUE(s.has_value());
  const Status started = (*s)->start();
  EXPECT_EQ(started.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(started.message().find("host budget"), std::string::npos) << started.to_string();
  EXPECT_EQ((*s)->host_bytes(), 0u);
}

}  // namespace
}  // namespace strata::engine

namespace strata::engine {
namespace {

// Steps [from, to) of the MLP on `s`, their losses.
std::vector<float> steps(Session& s, const Mlp& m, int from, int to) {
  std::vector<float> losses;
  for (int k = from; k < to; ++k) {
    Result<float> loss = train_step(s, m, k);
    EXPECT_TRUE(loss.has_value()) << "step " << k << ": " << loss.status().to_string();
    if (!loss) break;
    losses.push_back(*loss);
  }
  return losses;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, size_t offset) {
  ASSERT_LE(offset + b.size(), a.size());
  for (size_t k = 0; k < b.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint32_t>(a[offset + k]), std::bit_cast<uint32_t>(b[k]))
        << "step " << offset + k << ": " << a[offset + k] << " vs " << b[k];
  }
}

TEST(SessionCheckpoint, ASavedRunContinuesBitForBitOnAnyPlacement) {
  const Mlp m{32, 4, 8};
  TempDir nvme, ckpt;
  SessionOptions on_nvme = weights_on_nvme(nvme.path());
  on_nvme.device_bytes = model_state_bytes(m) / 4;
  Result<std::unique_ptr<Session>> a = make_session(m, on_nvme);
  ASSERT_TRUE(a.has_value()) << a.status().to_string();
  std::vector<float> whole = steps(**a, m, 0, 4);
  ASSERT_TRUE((*a)->save(ckpt.path()).ok());
  for (float l : steps(**a, m, 4, 10)) whole.push_back(l);
  ASSERT_EQ(whole.size(), 10u);
  // Into a session on NVMe as the saved one, and into one all in RAM.
  for (const SessionOptions& o : {on_nvme, base_options()}) {
    Result<std::unique_ptr<Session>> b = make_session(m, o);
    ASSERT_TRUE(b.has_value());
    const Status loaded = (*b)->load(ckpt.path());
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    EXPECT_EQ((*b)->steps_done(), 4);
    expect_same_bits(whole, steps(**b, m, 4, 10), 4);
  }
}

// A load into a session not started yet places it without its initial
// values: no chunk's init runs and nothing initial goes to NVMe (a big
// model's states are written once, by the load), and the run continues bit
// for bit as from a started one. A load refused there leaves it unstarted.
TEST(SessionCheckpoint, ALoadBeforeStartWritesNothingInitial) {
  const Mlp m{32, 4, 8};
  TempDir nvme, ckpt, empty;
  SessionOptions o = weights_on_nvme(nvme.path());
  Result<std::unique_ptr<Session>> a = make_session(m, o);
  ASSERT_TRUE(a.has_value()) << a.status().to_string();
  std::vector<float> whole = steps(**a, m, 0, 3);
  ASSERT_TRUE((*a)->save(ckpt.path()).ok());
  for (float l : steps(**a, m, 3, 6)) whole.push_back(l);
  a->reset();
  auto counted = [&](int* inits) -> Result<std::unique_ptr<Session>> {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(o));
    for (int64_t l = 0; l < m.L; ++l) {
      STRATA_RETURN_IF_ERROR(
          s->add_chunk("layer" + std::to_string(l), m.chunk_elems(), [&m, l, inits](std::span<float> d) {
             ++*inits;
             return init_layer(m, l, d);
           }).status());
    }
    return s;
  };
  int inits_started = 0, inits_unstarted = 0;
  Result<std::unique_ptr<Session>> started = counted(&inits_started);
  Result<std::unique_ptr<Session>> unstarted = counted(&inits_unstarted);
  ASSERT_TRUE(started.has_value() && unstarted.has_value());
  ASSERT_TRUE((*started)->start().ok());
  ASSERT_TRUE((*started)->load(ckpt.path()).ok());
  EXPECT_EQ(inits_started, m.L);
  EXPECT_EQ((*unstarted)->load(empty.path()).code(), StatusCode::kNotFound);
  EXPECT_FALSE((*unstarted)->started()) << "a refused load should leave the session as it was";
  const Status loaded = (*unstarted)->load(ckpt.path());
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  EXPECT_EQ(inits_unstarted, 0) << "no chunk's init should run for a load";
  const uint64_t states = static_cast<uint64_t>(m.L * m.chunk_elems()) * 12;
  EXPECT_LE((*unstarted)->counters().nvme_written_bytes + states, (*started)->counters().nvme_written_bytes)
      << "the initial states should not be written before the load";
  expect_same_bits(whole, steps(**unstarted, m, 3, 6), 3);
  expect_same_bits(whole, steps(**started, m, 3, 6), 3);
}

// Long work reports its progress chunk by chunk: start's initialising,
// save's saving, load's verifying and loading, each rising to its total.
TEST(SessionCheckpoint, StartSaveAndLoadReportTheirProgress) {
  const Mlp m{16, 3, 4};
  TempDir nvme, ckpt;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> seen;
  SessionOptions o = weights_on_nvme(nvme.path());
  o.progress = [&seen](std::string_view what, int64_t done, int64_t total) {
    seen[std::string(what)].emplace_back(done, total);
  };
  Result<std::unique_ptr<Session>> a = make_session(m, o);
  ASSERT_TRUE(a.has_value()) << a.status().to_string();
  ASSERT_EQ(steps(**a, m, 0, 1).size(), 1u);
  ASSERT_TRUE((*a)->save(ckpt.path()).ok());
  Result<std::unique_ptr<Session>> b = make_session(m, o);
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE((*b)->load(ckpt.path()).ok());
  // b loads before its start: nothing of it initialises.
  const std::map<std::string, int64_t> totals = {
      {"initialising", m.L}, {"saving", 2 * m.L}, {"verifying", 4 * m.L}, {"loading", 2 * m.L}};
  for (const auto& [what, total] : totals) {
    SCOPED_TRACE(what);
    const auto& calls = seen[what];
    ASSERT_FALSE(calls.empty());
    int64_t last = 0;
    for (const auto& [done, of] : calls) {
      EXPECT_EQ(of, total);
      EXPECT_GT(done, last) << "progress should rise";
      last = done;
    }
    EXPECT_EQ(last, total) << "progress should end at its total";
  }
}

// Each layer's weight and bias as tensors of their own: the model file
// holds them by name, a run resumes bit for bit from it, and a session
// that names its tensors otherwise refuses it.
Result<std::unique_ptr<Session>> make_named_session(const Mlp& m, SessionOptions o, const std::string& suffix) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, make_session(m, std::move(o)));
  for (int64_t l = 0; l < m.L; ++l) {
    const std::string layer = "layer" + std::to_string(l);
    STRATA_RETURN_IF_ERROR(s->add_tensor(static_cast<size_t>(l), {layer + ".weight" + suffix, 0, {m.D, m.D}}));
    STRATA_RETURN_IF_ERROR(s->add_tensor(static_cast<size_t>(l), {layer + ".bias" + suffix, m.D * m.D, {m.D}}));
  }
  return s;
}

TEST(SessionCheckpoint, NamedTensorsAreSavedByNameAndResumeBitForBit) {
  const Mlp m{32, 4, 8};
  TempDir nvme, ckpt;
  const SessionOptions on_nvme = weights_on_nvme(nvme.path());
  Result<std::unique_ptr<Session>> a = make_named_session(m, on_nvme, "");
  ASSERT_TRUE(a.has_value()) << a.status().to_string();
  std::vector<float> whole = steps(**a, m, 0, 3);
  ASSERT_TRUE((*a)->save(ckpt.path()).ok());
  for (float l : steps(**a, m, 3, 6)) whole.push_back(l);
  ASSERT_EQ(whole.size(), 6u);
  Result<SafetensorsReader> file = SafetensorsReader::open(ckpt.path() + "/step-3/model.safetensors");
  ASSERT_TRUE(file.has_value()) << file.status().to_string();
  ASSERT_EQ(file->tensors().size(), static_cast<size_t>(2 * m.L));
  const TensorInfo* w = file->find("layer2.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{m.D, m.D}));
  EXPECT_EQ(file->find("layer2"), nullptr) << "the chunk is saved as its tensors";
  for (const SessionOptions& o : {on_nvme, base_options()}) {
    Result<std::unique_ptr<Session>> b = make_named_session(m, o, "");
    ASSERT_TRUE(b.has_value());
    const Status loaded = (*b)->load(ckpt.path());
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    expect_same_bits(whole, steps(**b, m, 3, 6), 3);
  }
  Result<std::unique_ptr<Session>> other = make_named_session(m, base_options(), ".renamed");
  ASSERT_TRUE(other.has_value());
  const Status refused = (*other)->load(ckpt.path());
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_EQ((*other)->steps_done(), 0);
}

TEST(SessionCheckpoint, ARefusedCheckpointChangesNothing) {
  const Mlp m{16, 3, 4};
  TempDir ckpt;
  Result<std::unique_ptr<Session>> a = make_session(m, base_options());
  ASSERT_TRUE(a.has_value());
  steps(**a, m, 0, 2);
  ASSERT_TRUE((*a)->save(ckpt.path()).ok());
  // Another model's chunks.
  const Mlp other{16, 2, 4};
  Result<std::unique_ptr<Session>> b = make_session(other, base_options());
  ASSERT_TRUE(b.has_value());
  const Status wrong = (*b)->load(ckpt.path());
  EXPECT_EQ(wrong.code(), StatusCode::kFailedPrecondition) << wrong.to_string();
  EXPECT_NE(wrong.message().find("chunks"), std::string::npos) << wrong.to_string();
  EXPECT_EQ((*b)->steps_done(), 0);
  // One flipped bit in the optimizer's file: refused by name, nothing loaded.
  Result<CheckpointDir::Entry> latest = CheckpointDir(ckpt.path()).latest();
  ASSERT_TRUE(latest.has_value());
  const std::string file = latest->path + "/optimizer.safetensors";
  std::vector<char> bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 7] ^= 0x10;
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  Result<std::unique_ptr<Session>> c = make_session(m, base_options());
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE((*c)->start().ok());
  std::vector<float> before(static_cast<size_t>(m.chunk_elems())), after(before.size());
  ASSERT_TRUE((*c)->read_master(2, before).ok());
  const Status damaged = (*c)->load(ckpt.path());
  EXPECT_EQ(damaged.code(), StatusCode::kDataLoss) << damaged.to_string();
  EXPECT_NE(damaged.message().find("optimizer.safetensors"), std::string::npos) << damaged.to_string();
  EXPECT_EQ((*c)->steps_done(), 0);
  ASSERT_TRUE((*c)->read_master(2, after).ok());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
  // And the session still trains.
  EXPECT_EQ(steps(**c, m, 0, 1).size(), 1u);
}

TEST(SessionCheckpoint, SavingDuringAStepIsRefused) {
  const Mlp m{16, 2, 4};
  TempDir ckpt;
  Result<std::unique_ptr<Session>> s = make_session(m, base_options());
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE((*s)->begin_step().ok());
  EXPECT_EQ((*s)->save(ckpt.path()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*s)->load(ckpt.path()).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::engine
