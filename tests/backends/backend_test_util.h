// The harness under backend_ops_test.cpp. A case is one step of a few ops over random
// inputs; it carries what to upload (weights, vectors, KV pages), the reference result of
// each buffer it checks with a bound per element, and optionally the exact KV arena after
// the step. Nothing here knows a particular backend: a case runs on any backends::Backend.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "kernels/ops.h"

namespace metro::backends::testing {

inline constexpr double kU = 0x1p-24;  // unit roundoff of float
// What every activation buffer holds before the step: rows an op must not write keep it.
inline constexpr float kPoison = -12345.0f;

struct MatrixSrc {
  kernels::DType type = kernels::DType::kF32;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  std::vector<uint8_t> bytes;  // GGUF rows
  size_t row_stride = 0;       // bytes between rows in `bytes`
  size_t offset = 0;           // where row 0 starts (a column slice starts inside a row)
  MatrixUse use = MatrixUse::kProduct;
};

struct KvSrc {
  kernels::KvPageLayout layout;
  int n_layer = 1;
  int32_t n_blocks = 0;
  std::vector<uint8_t> bytes;  // the whole arena before the step
  std::vector<std::vector<int32_t>> tables;
};

// Buffer `act` after the step: rows [0, rows) within tol of want (per element, rows * cols
// values), the later rows unchanged.
struct Expect {
  ActId act{};
  int rows = 0;
  std::vector<double> want;
  std::vector<double> tol;
};

struct Uploaded {
  std::vector<std::unique_ptr<DeviceMatrix>> matrices;
  std::vector<std::unique_ptr<DeviceVector>> vectors;
  std::unique_ptr<DeviceBuffer> kv;
};

struct Case {
  std::string name;
  StateSpec spec;
  std::vector<std::vector<float>> init;  // per buffer, its whole contents before the step
  std::vector<int32_t> token, pos, seq;
  std::vector<SeqRun> runs;
  std::vector<int> logit_rows;
  std::vector<int16_t> adapter;  // per token (StepDesc::adapter); empty: none
  std::vector<MatrixSrc> matrices;
  std::vector<std::vector<float>> vectors;
  std::optional<KvSrc> kv;
  std::shared_ptr<const kernels::Rope> rope;
  std::function<std::vector<Op>(const Uploaded&)> ops;
  std::vector<Expect> expect;
  std::vector<uint8_t> want_kv;  // the arena after the step, exactly; empty: not checked
};

// A case of n_tokens tokens of one sequence at positions 0.. (ids 0..), the first n_logits
// of them wanting logits; no buffers yet.
Case make_case(std::string name, int n_tokens, int n_logits = 0);
// Adds a buffer (poisoned) and returns its id; its row count is the spec's maximum for
// `rows`, one more than the case uses, so writes past the rows show.
ActId add_act(Case& c, int64_t cols, RowSet rows = RowSet::kTokens);
// Writes `values` (whole rows) at the start of buffer `act`.
void set_rows(Case& c, ActId act, const std::vector<float>& values);
// The matrix products of the ops, for the spec (call once the ops are known).
void count_products(Case& c, int n_products, const std::vector<kernels::DType>& types, int64_t widest_k);

Uploaded upload(Backend& b, const Case& c);

struct Outcome {
  std::vector<std::vector<float>> acts;  // every buffer, whole
  std::vector<uint8_t> kv;
};
// Runs the case's step on a fresh state of `b` with a pool of n_threads.
Outcome run(Backend& b, const Case& c, const Uploaded& up, int n_threads);

// gtest checks of an outcome against the case's expectations.
void expect_matches(const Case& c, const Outcome& o);
void expect_same_bits(const Outcome& a, const Outcome& b, const std::string& what);

// Backends by name (available_backends()), each call a fresh instance.
std::vector<std::string> backend_names();
std::shared_ptr<Backend> backend_named(const std::string& name);

std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed);

}  // namespace metro::backends::testing
