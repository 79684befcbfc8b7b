// The model file changing on disk while a model loaded from it is in use (`cp new.gguf
// model.gguf` truncates the file first, then writes): the loaded model keeps computing the
// same outputs and never faults; a change during the load is a clean error; a watch logs a
// change once. Each test works on its own copy of a model in the temp dir.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace metro::model {
namespace {

using metro::testing::make_synthetic_model;
using metro::testing::SyntheticModelSpec;
using metro::testing::TempFile;

// Greedy tokens after `prompt` and the logits of every step, from a fresh KV each call.
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Generation generate(const Model& m, std::vector<int32_t> prompt, int n_new) {
  ThreadPool pool(2);
  WorkspaceLimits lim;
  lim.max_tokens = 64;
  lim.max_logits = 1;
  lim.max_seqs = 1;
  lim.max_blocks_per_seq = 16;
  Workspace ws = m.make_workspace(lim);
  SequenceKv kv(m, 128);
  Generation g;
  std::vector<int32_t> feed = std::move(prompt);
  int32_t pos = 0;
  for (int step = 0; step < n_new; ++step) {
    Batch b;
    for (size_t i = 0; i < feed.size(); ++i) b.add(feed[i], pos++, 0, i + 1 == feed.size());
    auto out = m.forward(b, kv.view(), ws, pool);
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (!out.ok()) return g;
    auto row = out->row(0);
    g.logits.emplace_back(row.begin(), row.end());
    const int32_t next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    g.tokens.push_back(next);
    feed = {next};
  }
  return g;
}

void truncate_to(const std::string& path, off_t size) { ASSERT_EQ(::truncate(path.c_str(), size), 0); }

off_t size_of(const std::string& path) {
  auto s = FileStamp::of(path);
  return s.ok() ? static_cast<off_t>(s->size) : -1;
}

SyntheticModelSpec small_spec() {
  SyntheticModelSpec s;
  s.n_layer = 4;  // enough that the second half of the file holds whole layers
  s.tied_output = false;
  return s;
}

// Truncated to half, then to nothing, with and without repacked weights (without, the CPU
// backend computes from the loaded bytes in place): the same logits, bit for bit, and the
// metadata and vocabulary still read.
TEST(ModelFile, TruncatedWhileInUseKeepsServingTheLoadedCopy) {
  for (bool repack : {false, true}) {
    SCOPED_TRACE(repack ? "repacked" : "not repacked");
    TempFile tmp;
    tmp.write(make_synthetic_model(small_spec()));
    ModelOptions o;
    o.allow_repack = repack;
    auto m = Model::load(tmp.path(), o);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const Generation before = generate(**m, {1, 2, 3, 4, 5}, 6);
    ASSERT_EQ(before.tokens.size(), 6u);

    for (off_t size : {size_of(tmp.path()) / 2, off_t{0}}) {
      truncate_to(tmp.path(), size);
      const Generation after = generate(**m, {1, 2, 3, 4, 5}, 6);
      EXPECT_EQ(after.tokens, before.tokens);
      EXPECT_EQ(after.logits, before.logits);
      auto name = (*m)->file().get_string("general.name");
      ASSERT_TRUE(name.ok());
      EXPECT_EQ(*name, "synthetic");
      // The vocabulary is read from the loaded bytes too.
      auto tok = tokenizer::Tokenizer::from_gguf((*m)->file());
      ASSERT_TRUE(tok.ok()) << tok.status().message();
      EXPECT_EQ(tok->n_vocab(), 300);
      EXPECT_EQ(tok->token_to_piece(299), "t299");
    }
  }
}

// The real model, computed from the loaded bytes in place (--no-repack), truncated to half and
// to zero while in use: the same greedy generation.
TEST(ModelFile, RealModelTruncatedWhileInUseGeneratesTheSame) {
  REQUIRE_MODEL();
  TempFile tmp;
  {
    std::ifstream in(metro::testing::default_model_path(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(bytes.empty());
    tmp.write(bytes);
  }
  ModelOptions o;
  o.allow_repack = false;
  auto m = Model::load(tmp.path(), o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto tok = tokenizer::Tokenizer::from_gguf((*m)->file());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const std::vector<int32_t> prompt = tok->encode("The capital of France is", false, false);
  const Generation before = generate(**m, prompt, 8);
  for (off_t size : {size_of(tmp.path()) / 2, off_t{0}}) {
    truncate_to(tmp.path(), size);
    const Generation after = generate(**m, prompt, 8);
    EXPECT_EQ(after.tokens, before.tokens);
    EXPECT_EQ(after.logits, before.logits);
    EXPECT_EQ(tok->decode(after.tokens), tok->decode(before.tokens));
  }
}

// The file cut short or rewritten while it is being read: load() fails with a message that
// says so, and nothing faults.
TEST(ModelFile, ChangedDuringLoadIsACleanError) {
  const std::vector<uint8_t> bytes = make_synthetic_model(small_spec());
  struct Case {
    const char* what;
    std::function<void(const std::string& path)> change;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"truncated to half", [&](const std::string& p) { truncate_to(p, static_cast<off_t>(bytes.size() / 2)); },
       "cut short while it was read"},
      {"truncated to zero", [](const std::string& p) { truncate_to(p, 0); }, "cut short while it was read"},
      {"rewritten in place",
       [&](const std::string& p) {
         // Past the file system's timestamp granularity, so the write time differs.
         std::this_thread::sleep_for(std::chrono::milliseconds(30));
         std::vector<uint8_t> other = bytes;
         other[other.size() - 1] ^= 0xff;
         std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(static_cast<std::streamoff>(other.size() - 1));
         f.put(static_cast<char>(other.back()));
       },
       "changed while it was read"},
      {"grown", [&](const std::string& p) { truncate_to(p, static_cast<off_t>(bytes.size() * 2)); },
       "changed while it was read"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempFile tmp;
    tmp.write(bytes);
    ModelOptions o;
    o.allow_repack = false;
    o.read.chunk_bytes = 4096;
    bool changed = false;
    o.read.on_chunk = [&](size_t, size_t) {
      if (changed) return;
      changed = true;
      c.change(tmp.path());
    };
    auto m = Model::load(tmp.path(), o);
    ASSERT_TRUE(changed);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(c.expect), std::string::npos) << m.status().message();
    EXPECT_NE(m.status().message().find(tmp.path().substr(tmp.path().rfind('/') + 1)), std::string::npos);
    EXPECT_EQ(m.status().message().find("/tmp"), std::string::npos) << "no full path in errors";
  }
}

// A writer overwriting the file the way `cp` does (truncate, then write in pieces) over and
// over while loads run: each load either gives a model equal to the original or fails
// cleanly.
TEST(ModelFile, LoadsRacingACopyOverTheFileSucceedOrFailCleanly) {
  const std::vector<uint8_t> bytes = make_synthetic_model(small_spec());
  TempFile tmp;
  tmp.write(bytes);
  auto ref = Model::load(tmp.path());
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const Generation want = generate(**ref, {7, 8, 9}, 3);

  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load()) {
      std::ofstream f(tmp.path(), std::ios::binary | std::ios::trunc);
      for (size_t at = 0; at < bytes.size() && !stop.load(); at += 64 * 1024) {
        f.write(reinterpret_cast<const char*>(bytes.data() + at),
                static_cast<std::streamsize>(std::min<size_t>(64 * 1024, bytes.size() - at)));
        f.flush();
      }
    }
  });
  int ok = 0, refused = 0;
  for (int i = 0; i < 20; ++i) {
    ModelOptions o;
    o.read.chunk_bytes = 16 * 1024;
    auto m = Model::load(tmp.path(), o);
    if (!m.ok()) {
      ++refused;
      continue;
    }
    ++ok;
    EXPECT_EQ(generate(**m, {7, 8, 9}, 3).logits, want.logits);
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(ok + refused, 20);
  std::printf("loads racing a writer: %d loaded whole, %d refused\n", ok, refused);
}

// With a watch, the first change is logged once, says the loaded copy is still served, and
// the model computes as before.
TEST(ModelFile, WatchLogsAChangeOnceAndKeepsServing) {
  TempFile tmp;
  tmp.write(make_synthetic_model(small_spec()));
  ModelOptions o;
  o.allow_repack = false;
  o.watch_period = std::chrono::milliseconds(10);
  auto m = Model::load(tmp.path(), o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Generation before = generate(**m, {1, 2, 3}, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE((*m)->file_changed_on_disk());

  ::testing::internal::CaptureStderr();
  truncate_to(tmp.path(), size_of(tmp.path()) / 2);
  for (int i = 0; i < 500 && !(*m)->file_changed_on_disk(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  truncate_to(tmp.path(), 0);  // a second change is not logged again
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE((*m)->file_changed_on_disk());
  const std::string line = "changed on disk";
  size_t count = 0;
  for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << log;
  EXPECT_NE(log.find("still serving the copy loaded at start"), std::string::npos) << log;
  EXPECT_NE(log.find("size "), std::string::npos) << log;
  EXPECT_EQ(log.find("/tmp"), std::string::npos) << "the base name only: " << log;
  EXPECT_EQ(generate(**m, {1, 2, 3}, 4).logits, before.logits);
}

// After loading, the copy's bytes that no weight reads are given back (serve does this): the
// model computes the same logits, the metadata and vocabulary still read, every range the
// weights read is readable, and a second call gives nothing more. Repacked, that is most of
// the file; read in place, only the vectors the backend copied.
TEST(ModelFile, GivingBackTheUnreadCopyKeepsOutputsAndMetadata) {
  for (bool repack : {false, true}) {
    SCOPED_TRACE(repack ? "repacked" : "not repacked");
    TempFile tmp;
    SyntheticModelSpec spec = small_spec();
    spec.matrix_type = kernels::DType::kQ8_0;  // repacked without the row-major bytes kept (F16 keeps them)
    tmp.write(make_synthetic_model(spec));
    ModelOptions o;
    o.allow_repack = repack;
    auto m = Model::load(tmp.path(), o);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const Generation before = generate(**m, {1, 2, 3, 4, 5}, 6);
    uint64_t tensor_bytes = 0, matrix_bytes = 0;
    for (const auto& t : (*m)->file().tensors()) {
      tensor_bytes += t.n_bytes;
      if (t.n_dims == 2) matrix_bytes += t.n_bytes;
    }
    const uint64_t given = (*m)->give_back_unread_file_bytes();
    EXPECT_EQ((*m)->file_given_back(), given);
    EXPECT_LE(given, tensor_bytes);
    if (repack) {
      // Every matrix but the embedding table (read in place as rows) was copied.
      EXPECT_GT(given, matrix_bytes / 2) << tensor_bytes;
    } else {
      EXPECT_LT(given, tensor_bytes - matrix_bytes + 4096);
    }
    EXPECT_EQ((*m)->give_back_unread_file_bytes(), 0u);
    uint64_t sum = 0, n = 0;
    for (const auto& r : (*m)->weight_memory()) {
      for (uint8_t b : r) sum += b;
      n += r.size();
    }
    EXPECT_GT(n, 0u);
    EXPECT_GT(sum, 0u);
    const Generation after = generate(**m, {1, 2, 3, 4, 5}, 6);
    EXPECT_EQ(after.tokens, before.tokens);
    EXPECT_EQ(after.logits, before.logits);
    auto tok = tokenizer::Tokenizer::from_gguf((*m)->file());
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->token_to_piece(299), "t299");
  }
}

// The real model as `metro serve` loads it: more than half of the file's copy goes back, and
// greedy generation is unchanged.
TEST(ModelFile, RealModelGivesBackMostOfItsCopy) {
  REQUIRE_MODEL();
  auto m = Model::load(metro::testing::default_model_path());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto tok = tokenizer::Tokenizer::from_gguf((*m)->file());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const std::vector<int32_t> prompt = tok->encode("The capital of France is", false, false);
  const Generation before = generate(**m, prompt, 8);
  const uint64_t given = (*m)->give_back_unread_file_bytes();
  EXPECT_GT(given, (*m)->file().file_size() / 2);
  const Generation after = generate(**m, prompt, 8);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.logits, before.logits);
  std::printf("given back %.1f of %.1f MiB\n", static_cast<double>(given) / (1 << 20),
              static_cast<double>((*m)->file().file_size()) / (1 << 20));
}

}  // namespace
}  // namespace metro::model
