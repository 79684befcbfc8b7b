// metro bench -m MODEL [-p 512] [-n 128] [-r 5] [-t N] [--batch 1,4,16,32] [--kv-type f16|q8_0]
//             [--json] [--profile]
//       metro bench -m MODEL --spec ngram -f PROMPT_FILE [-f ...] [--chat] [-n 256] [-r 1]
//
// Like llama-bench: prompt processing (pp: one batch of p tokens) and generation (tg: n
// tokens one at a time from an empty context) in tokens/s, median and spread over
// repetitions, plus weight bytes read per generated token, achieved GB/s and the fraction
// of this machine's measured read bandwidth. With --batch, like llama-batched-bench: for
// each count of sequences, prefill of p tokens each and decode of n tokens each, summed.
// --profile times every op of the decode steps (on a device backend an event per op and a
// wait per step, which slows them) and adds the milliseconds per step of each op kind and
// the GOP/s of the products and of attention; without --batch, also of one more prompt
// (prefill_profile_*), run after the timed ones.
// With --spec, single-sequence decoding through the engine with speculation off and on
// (bench_spec.cpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "backends/registry.h"
#include "base/clock.h"
#include "base/residency.h"
#include "base/thread_pool.h"
#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "kernels/matmul.h"
#include "kernels/roofline.h"
#include "kv/kv_arena.h"

namespace metro::cli {
namespace {

using nlohmann::json;

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Spread s;
  if (v.empty()) return s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

// Arithmetic of a run, in operations (a multiply-add is 2): the matrix products and the
// attention (a query against a key: QK and PV, every head, every layer).
struct OpCount {
  double product = 0, attention = 0;
  double total() const { return product + attention; }
};

// Sum of the key counts a sequence's queries at positions [from, to) attend to (causal).
double causal_keys(double from, double to) { return (to * (to + 1) - from * (from + 1)) / 2; }

// The same summed over the model's layers, each within its window (a query at q sees
// min(q + 1, window) keys).
double layer_keys(const model::HParams& hp, double from, double to) {
  double sum = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const double w = hp.layer_window(il);
    if (w == 0 || to <= w) {
      sum += causal_keys(from, to);
    } else {
      sum += causal_keys(from, std::max(from, w)) + w * (to - std::max(from, w));
    }
  }
  return sum;
}

// `tokens` tokens through the products, `logits` of them through the head too, and the
// attention of `n_seq` sequences' queries at positions [from, to).
OpCount count_ops(const model::Model& m, double tokens, double logits, double n_seq, double from, double to) {
  const model::HParams& hp = m.hparams();
  OpCount c;
  c.product = 2.0 * (tokens * static_cast<double>(m.weights().product_macs(false)) +
                     logits * static_cast<double>(m.weights().product_macs(true) - m.weights().product_macs(false)));
  c.attention = 2.0 * n_seq * layer_keys(hp, from, to) * hp.n_head * (hp.head_dim + hp.head_dim_v);
  return c;
}

// Whether every product multiplies int8 quants (block formats), so the int8 peak bounds it;
// float weights are bound by the FP32 peak.
bool products_in_int8(const model::Model& m) {
  for (kernels::DType t : m.weights().matmul_types()) {
    if (t == kernels::DType::kF32 || t == kernels::DType::kF16 || t == kernels::DType::kBF16) return false;
  }
  return true;
}

struct Runner {
  const model::Model& m;
  ThreadPool& pool;
  model::Workspace ws;
  kernels::DType kv_type = kernels::DType::kF16;
  std::mt19937 rng{1234};
  size_t kv_bytes = 0;  // the last run's KV arena
  backends::StepProfile* profile = nullptr;          // observes the decode steps when set
  backends::StepProfile* prefill_profile = nullptr;  // observes the prefill steps when set

  int32_t random_token() {
    return static_cast<int32_t>(rng() % m.hparams().n_vocab);
  }
  // Run-time adapters (--adapter): sequence s runs adapter s mod n + 1.
  int16_t adapter_of(int s) const {
    return m.n_adapters() == 0 ? int16_t{0} : static_cast<int16_t>(s % m.n_adapters() + 1);
  }

  // Prefill of n_seq prompts of p tokens each (chunks of at most ws max_tokens tokens,
  // whole sequences' chunks interleaved), then n decode steps over all sequences.
  // Returns {prefill seconds, decode seconds, unused KV slot fraction}.
  std::tuple<double, double, double> run(int n_seq, int p, int n) {
    const int bs = 16;
    const kernels::KvPageLayout layout = m.kv_layout(kv_type, bs);
    const int per_seq_blocks = (p + n + bs - 1) / bs;
    kv::KvArena arena(m.backend(), m.kv_layers(), layout, n_seq * per_seq_blocks);  // in the model's device memory
    kv_bytes = arena.bytes();
    std::vector<std::vector<kv::BlockId>> owned(static_cast<size_t>(n_seq));
    std::vector<std::span<const kv::BlockId>> tables;
    for (int s = 0; s < n_seq; ++s) {
      for (int b = 0; b < per_seq_blocks; ++b) owned[static_cast<size_t>(s)].push_back(s * per_seq_blocks + b);
      tables.emplace_back(owned[static_cast<size_t>(s)]);
    }
    const model::KvView view = arena.view(tables);
    model::Batch batch;
    const int max_tokens = ws.limits().max_tokens;

    const int64_t t0 = now_ns();
    std::vector<int> done(static_cast<size_t>(n_seq), 0);
    int remaining = n_seq * p;
    while (remaining > 0) {
      batch.clear();
      for (int s = 0; s < n_seq && batch.size() < max_tokens; ++s) {
        const int take = std::min(p - done[static_cast<size_t>(s)], max_tokens - batch.size());
        for (int i = 0; i < take; ++i) {
          const int pos = done[static_cast<size_t>(s)] + i;
          batch.add(random_token(), pos, s, pos == p - 1, adapter_of(s));
        }
        done[static_cast<size_t>(s)] += take;
        remaining -= take;
      }
      model::ForwardOptions pfo;
      pfo.observer = prefill_profile;
      auto out = m.forward(batch, view, ws, pool, pfo);
      METRO_CHECK_MSG(out.ok(), out.status().message().c_str());
    }
    const int64_t t1 = now_ns();
    for (int step = 0; step < n; ++step) {
      batch.clear();
      for (int s = 0; s < n_seq; ++s) batch.add(random_token(), p + step, s, true, adapter_of(s));
      model::ForwardOptions fo;
      fo.observer = profile;
      auto out = m.forward(batch, view, ws, pool, fo);
      METRO_CHECK_MSG(out.ok(), out.status().message().c_str());
    }
    const int64_t t2 = now_ns();
    const double slots = static_cast<double>(n_seq) * ((p + n + bs - 1) / bs) * bs;
    const double used = static_cast<double>(n_seq) * (p + n);
    return {static_cast<double>(t1 - t0) * 1e-9, static_cast<double>(t2 - t1) * 1e-9,
            (slots - used) / slots};
  }
};

// Milliseconds per decode step of each op kind the profile saw, and of all of them.
json profile_ms(const backends::StepProfile& prof, int steps) {
  json o = json::object();
  for (int k = 0; k < backends::kNumOpKinds; ++k) {
    const auto kind = static_cast<backends::OpKind>(k);
    if (prof.calls(kind) > 0) o[std::string(backends::op_name(kind))] = 1e3 * prof.seconds(kind) / steps;
  }
  o["total"] = 1e3 * prof.total_seconds() / steps;
  return o;
}

// Achieved GOP/s of the products and of attention in the profiled steps, whose arithmetic
// was `ops` in all.
json profile_gops(const backends::StepProfile& prof, const OpCount& ops) {
  json o = json::object();
  const double proj = prof.seconds(backends::OpKind::kProject), attn = prof.seconds(backends::OpKind::kAttention);
  if (proj > 0) o["project"] = ops.product / proj / 1e9;
  if (attn > 0) o["attention"] = ops.attention / attn / 1e9;
  return o;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    v.push_back(std::stoi(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return v;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Measure prompt processing and generation speed", "metro bench"};
  std::string model_path, batch_list, kv_type = "f16", device = "cpu";
  int p = 512, n = 128, reps = 5, threads = default_threads();
  bool as_json = false, no_repack = false, profile = false;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  LoraFlags lora;
  add_lora_flags(app, lora);
  std::vector<std::string> adapter_files;
  app.add_option("--adapter", adapter_files,
                 "a LoRA adapter applied at run time, as metro serve --lora applies it (repeatable): sequence s runs "
                 "adapter s mod N + 1");
  app.add_option("-p,--n-prompt", p, "prompt tokens (pp test; per sequence with --batch)")->check(CLI::Range(1, 1 << 16));
  app.add_option("-n,--n-gen", n, "generated tokens (tg test; per sequence with --batch)")->check(CLI::Range(1, 1 << 16));
  app.add_option("-r,--repetitions", reps, "repetitions")->check(CLI::Range(1, 1000));
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--batch", batch_list, "sequence counts for batched prefill/decode, e.g. 1,4,16,32");
  app.add_option("--kv-type", kv_type, "KV cache type, as metro serve's: f16 or q8_0")->capture_default_str();
  app.add_flag("--json", as_json, "print one JSON object");
  app.add_flag("--profile", profile,
               "time each op of the decode steps (slower; without --batch also one more prompt) and report ms and GOP/s by op kind");
  app.add_flag("--no-repack", no_repack, "use weights in their GGUF layout");
  MemBudgetFlags budget_flags;
  add_mem_budget_flags(app, budget_flags);
  app.add_flag("--cold-uncached", budget_flags.drop_page_cache,
               "with --mem-budget: also drop given-back experts from the page cache, so every read of one is a disk "
               "read (the worst case)");
  app.add_option("--device", device, "where the model runs: " + backends::device_names())->capture_default_str();
  SpecBenchOptions sb;
  add_spec_flags(app, sb.spec, "");
  app.add_option("-f,--file", sb.files, "with --spec: prompt files (FILE.prediction beside one is its prediction)");
  app.add_flag("--chat", sb.chat, "with --spec: each file is a user message of the model's chat template");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!sb.spec.mode.empty()) {
    auto lm = load_model(model_path, !no_repack, device, std::chrono::milliseconds{0}, true, lora.specs());
    if (!lm.ok()) return fail("bench", lm.status());
    sb.threads = threads;
    sb.json = as_json;
    sb.reps = app.count("-r") ? reps : 1;
    sb.n_gen = app.count("-n") ? n : 256;
    return bench_speculation(*lm, sb);
  }
  auto kv_dtype = parse_kv_type(kv_type);
  if (!kv_dtype.ok()) return fail("bench", kv_dtype.status());
  std::vector<int> batches;
  try {
    if (!batch_list.empty()) batches = parse_list(batch_list);
  } catch (...) {
    return fail("bench", invalid_argument("--batch takes a comma-separated list of counts"));
  }
  for (int b : batches) {
    if (b < 1 || b > 1024) return fail("bench", invalid_argument("--batch counts must be in [1, 1024]"));
  }
  std::vector<model::LoraSpec> adapters;
  for (const std::string& f : adapter_files) adapters.push_back({f, 1.0f});
  auto budget = budget_flags.parse();
  if (!budget.ok()) return fail("bench", budget.status());
  auto lm = load_model(model_path, !no_repack, device, std::chrono::milliseconds{0}, true, lora.specs(), adapters,
                       *budget);
  if (!lm.ok()) return fail("bench", lm.status());
  const model::Model& m = *lm->model;
  const uint64_t faults_at_start = major_page_faults();
  const bool on_cpu = device == "cpu";
  ThreadPool pool(on_cpu ? threads : 1);  // a device backend only enqueues
  const int max_seq = batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
  model::WorkspaceLimits lim;
  lim.max_tokens = std::max(512, max_seq);
  lim.max_logits = std::max(1, max_seq);
  lim.max_seqs = std::max(1, max_seq);
  lim.max_blocks_per_seq = (p + n) / 16 + 2;
  lim.n_ctx = p + n;
  Runner runner{m, pool, m.make_workspace(lim), *kv_dtype};

  json j;
  // Under --mem-budget: the cold store's traffic and the disk reads of the whole run.
  auto budget_report = [&] {
    if (m.mem_budget() == 0) return;
    const ColdStore* cs = m.cold_store();
    const ColdStore::Stats c = cs ? cs->stats() : ColdStore::Stats{};
    const uint64_t faults = major_page_faults() - faults_at_start;
    j["mem_budget"] = {{"budget_bytes", m.mem_budget()},   {"hot_bytes", total_bytes(m.weight_memory())},
                       {"cold_bytes", c.bytes},           {"cold_mapped_limit_bytes", c.budget},
                       {"cold_reads", c.faults_in},       {"cold_releases", c.releases},
                       {"major_page_faults", faults},     {"page_cache_dropped", budget_flags.drop_page_cache}};
    if (!as_json) {
      std::printf("memory budget %.1f MiB: %.1f MiB hot, %.1f MiB cold (%.1f MiB mapped at most) | "
                  "%llu cold pieces read in, %llu given back, %llu major page faults%s\n",
                  static_cast<double>(m.mem_budget()) / (1 << 20),
                  static_cast<double>(total_bytes(m.weight_memory())) / (1 << 20), static_cast<double>(c.bytes) / (1 << 20),
                  static_cast<double>(c.budget) / (1 << 20), static_cast<unsigned long long>(c.faults_in),
                  static_cast<unsigned long long>(c.releases), static_cast<unsigned long long>(faults),
                  budget_flags.drop_page_cache ? " (page cache dropped)" : "");
    }
  };
  j["model"] = m.hparams().name;
  j["weights"] = m.weights().describe_layouts();
  j["threads"] = threads;
  j["kv_type"] = kv_type;
  j["kernel_isa"] = std::string(kernels::kernel_isa());
  j["backend"] = std::string(m.backend()->name());
  j["n_prompt"] = p;
  j["n_gen"] = n;
  j["repetitions"] = reps;
  // The host's ceilings are the anchors of a CPU run only.
  kernels::MachinePeaks peaks;
  // Not under a memory budget: the bandwidth test reads a 512 MiB buffer of its own.
  if (on_cpu && m.mem_budget() == 0) peaks = kernels::measure_peaks(pool);
  const double bw = peaks.read_gbps;
  const uint64_t bpt = m.weights().bytes_per_token();
  j["mem_read_gbps"] = bw;
  j["weight_bytes_per_token"] = bpt;
  // The roofline: the peak that bounds the products (int8 for block formats), and what each
  // test achieved against it; attention is counted in the achieved rate, in FP32.
  const bool int8 = products_in_int8(m);
  const double peak = int8 ? peaks.int8_gops : peaks.fp32_gflops;
  json roof = {{"int8_peak_gops", peaks.int8_gops}, {"fp32_peak_gflops", peaks.fp32_gflops},
               {"read_gbps", peaks.read_gbps}, {"products_bound_by", int8 ? "int8" : "fp32"},
               {"product_macs_per_token", m.weights().product_macs(true)}};
  auto fraction = [&](double gops) { return peak > 0 ? gops / peak : 0.0; };
  auto print_peaks = [&] {
    if (peak <= 0) return;
    std::printf("roofline (%d threads): int8 peak %.0f GOP/s, fp32 peak %.0f GFLOP/s, read %.2f GB/s\n", threads,
                peaks.int8_gops, peaks.fp32_gflops, peaks.read_gbps);
  };
  auto roof_line = [&](const char* what, double gops) {
    if (peak > 0) {
      std::printf("%s: %.1f GOP/s, %.1f%% of the %s peak\n", what, gops, 100.0 * fraction(gops), int8 ? "int8" : "fp32");
    } else {
      std::printf("%s: %.1f GOP/s\n", what, gops);
    }
  };

  if (batches.empty()) {
    runner.run(1, 16, 4);  // warm-up: page in weights, settle the pool
    std::vector<double> pp, tg;
    Progress bar("bench", static_cast<uint64_t>(2 * reps));
    for (int r = 0; r < reps; ++r) {
      auto [pp_s, unused_tg, unused] = runner.run(1, p, 0 + 1);
      (void)unused_tg;
      (void)unused;
      pp.push_back(p / pp_s);
      bar.advance(1, "pp" + std::to_string(p));
    }
    backends::StepProfile prof;
    runner.profile = profile ? &prof : nullptr;
    for (int r = 0; r < reps; ++r) {
      auto [pp_s, tg_s, unused] = runner.run(1, 1, n);
      (void)pp_s;
      (void)unused;
      tg.push_back(n / tg_s);
      bar.advance(1, "tg" + std::to_string(n));
    }
    bar.clear();
    runner.profile = nullptr;
    // tg runs a 1-token prompt, then n steps at positions 1..n.
    const OpCount pp_ops = count_ops(m, p, 1, 1, 0, p);
    const OpCount tg_ops = count_ops(m, n, n, 1, 1, n + 1);
    if (profile) {
      // One more prompt, timed op by op (not counted in pp: the timing slows it).
      backends::StepProfile pprof;
      runner.prefill_profile = &pprof;
      runner.run(1, p, 1);
      runner.prefill_profile = nullptr;
      j["prefill_profile_ms"] = profile_ms(pprof, 1);
      j["prefill_profile_gops"] = profile_gops(pprof, pp_ops);
      j["decode_profile_ms"] = profile_ms(prof, reps * n);
      OpCount all = tg_ops;
      all.product *= reps;
      all.attention *= reps;
      j["decode_profile_gops"] = profile_gops(prof, all);
    }
    const Spread a = spread(pp), b = spread(tg);
    j["pp"] = a.median;
    j["tg"] = b.median;
    j["pp_min"] = a.min;
    j["pp_max"] = a.max;
    j["tg_min"] = b.min;
    j["tg_max"] = b.max;
    j["pp_runs"] = pp;
    j["tg_runs"] = tg;
    const double gbps = static_cast<double>(bpt) * b.median / 1e9;
    j["tg_gbps"] = gbps;
    j["tg_bw_fraction"] = bw > 0 ? gbps / bw : 0.0;
    const double pp_gops = pp_ops.total() * a.median / p / 1e9, tg_gops = tg_ops.total() * b.median / n / 1e9;
    roof["pp_gops"] = pp_gops;
    roof["pp_peak_fraction"] = fraction(pp_gops);
    roof["tg_gops"] = tg_gops;
    roof["tg_peak_fraction"] = fraction(tg_gops);
    roof["tg_bw_fraction"] = j["tg_bw_fraction"];
    j["roofline"] = roof;
    if (as_json) budget_report();
    if (as_json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("model: %s | backend %s | threads %d | kernels %s | KV %s\nweights: %s\n",
                  m.hparams().name.c_str(), std::string(m.backend()->name()).c_str(), threads,
                  std::string(kernels::kernel_isa()).c_str(), kv_type.c_str(), m.weights().describe_layouts().c_str());
      std::printf("%-8s %12s %12s %12s\n", "test", "tokens/s", "min", "max");
      std::printf("pp%-6d %12.2f %12.2f %12.2f\n", p, a.median, a.min, a.max);
      std::printf("tg%-6d %12.2f %12.2f %12.2f\n", n, b.median, b.min, b.max);
      if (profile) {
        std::printf("pp ms per prompt by op: %s\n", j["prefill_profile_ms"].dump().c_str());
        std::printf("pp GOP/s by op: %s\n", j["prefill_profile_gops"].dump().c_str());
        std::printf("tg ms per step by op: %s\n", j["decode_profile_ms"].dump().c_str());
        std::printf("tg GOP/s by op: %s\n", j["decode_profile_gops"].dump().c_str());
      }
      if (bw > 0) {
        std::printf("tg reads %.1f MiB of weights per token: %.2f GB/s, %.0f%% of the %.2f GB/s measured read bandwidth\n",
                    static_cast<double>(bpt) / (1 << 20), gbps, 100.0 * gbps / bw, bw);
      } else {
        std::printf("tg reads %.1f MiB of weights per token: %.2f GB/s\n", static_cast<double>(bpt) / (1 << 20), gbps);
      }
      print_peaks();
      roof_line(("pp" + std::to_string(p)).c_str(), pp_gops);
      roof_line(("tg" + std::to_string(n)).c_str(), tg_gops);
      budget_report();
    }
    return 0;
  }

  runner.run(1, 16, 4);
  json arr = json::array();
  if (!as_json) {
    std::printf("model: %s | backend %s | threads %d | kernels %s | KV %s | prompt %d, generate %d per sequence\n",
                m.hparams().name.c_str(), std::string(m.backend()->name()).c_str(), threads,
                std::string(kernels::kernel_isa()).c_str(), kv_type.c_str(), p, n);
    print_peaks();
    std::printf("%6s %14s %14s %12s %16s %14s %14s\n", "n_seq", "prefill tok/s", "decode tok/s", "KV unused",
                "weights GB/s", "prefill GOP/s", "decode GOP/s");
  }
  Progress bar("bench", static_cast<uint64_t>(reps) * batches.size());
  for (int ns : batches) {
    std::vector<double> pre, dec;
    double unused_frac = 0;
    backends::StepProfile prof;
    runner.profile = profile ? &prof : nullptr;
    for (int r = 0; r < reps; ++r) {
      auto [pp_s, tg_s, unused] = runner.run(ns, p, n);
      pre.push_back(ns * static_cast<double>(p) / pp_s);
      dec.push_back(ns * static_cast<double>(n) / tg_s);
      unused_frac = unused;
      bar.advance(1, "batch " + std::to_string(ns));
    }
    bar.clear();  // the row goes where the progress line stood
    runner.profile = nullptr;
    const Spread a = spread(pre), b = spread(dec);
    // A decode step reads every weight once for all ns sequences.
    const double step_gbps = static_cast<double>(bpt) * b.median / ns / 1e9;
    arr.push_back({{"n_seq", ns}, {"prefill_tps", a.median}, {"decode_tps", b.median}, {"decode_weight_gbps", step_gbps},
                   {"prefill_min", a.min}, {"prefill_max", a.max}, {"decode_min", b.min},
                   {"decode_max", b.max}, {"kv_unused_fraction", unused_frac},
                   {"kv_bytes", runner.kv_bytes}});
    const OpCount pre_ops = count_ops(m, static_cast<double>(ns) * p, ns, ns, 0, p);
    const OpCount dec_ops = count_ops(m, static_cast<double>(ns) * n, static_cast<double>(ns) * n, ns, p, p + n);
    const double pre_gops = pre_ops.total() * a.median / (static_cast<double>(ns) * p) / 1e9;
    const double dec_gops = dec_ops.total() * b.median / (static_cast<double>(ns) * n) / 1e9;
    arr.back()["prefill_gops"] = pre_gops;
    arr.back()["decode_gops"] = dec_gops;
    arr.back()["prefill_peak_fraction"] = fraction(pre_gops);
    arr.back()["decode_peak_fraction"] = fraction(dec_gops);
    OpCount all = dec_ops;
    all.product *= reps;
    all.attention *= reps;
    if (profile) {
      arr.back()["decode_profile_ms"] = profile_ms(prof, reps * n);
      arr.back()["decode_profile_gops"] = profile_gops(prof, all);
    }
    if (!as_json) {
      auto pct = [&](double g) { return peak > 0 ? " (" + std::to_string(static_cast<int>(100.0 * fraction(g) + 0.5)) + "%)" : std::string(); };
      std::printf("%6d %14.2f %14.2f %11.1f%% %16.1f %14s %14s\n", ns, a.median, b.median, 100 * unused_frac, step_gbps,
                  (std::to_string(static_cast<int>(pre_gops + 0.5)) + pct(pre_gops)).c_str(),
                  (std::to_string(static_cast<int>(dec_gops + 0.5)) + pct(dec_gops)).c_str());
      if (profile) {
        std::printf("       decode ms per step by op: %s\n", profile_ms(prof, reps * n).dump().c_str());
        std::printf("       decode GOP/s by op: %s\n", profile_gops(prof, all).dump().c_str());
      }
    }
  }
  j["batch"] = arr;
  j["roofline"] = roof;
  j["kv_bytes_per_token_f16"] = m.hparams().kv_bytes_per_token(2.0);
  budget_report();
  if (as_json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace metro::cli
