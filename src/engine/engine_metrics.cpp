// The engine's series on /metrics, each labelled with the model it serves.
#include <map>

#include "base/residency.h"
#include "engine/engine_impl.h"

namespace metro::engine {

namespace {

void write_class_metrics(metrics::Exposition& e, const std::string& model, const sched::SchedMetricsSnapshot& s) {
  auto label = [&](size_t c) {
    return metrics::labels({{"model", model}, {"class", sla_class_name(static_cast<SlaClass>(c))}});
  };
  auto hist = [&](const char* name, const char* help, auto member) {
    for (size_t c = 0; c < s.classes.size(); ++c) {
      const sched::HistogramSnapshot& h = s.classes[c].*member;
      std::vector<uint64_t> cumulative(h.bounds.size());
      uint64_t acc = 0;
      for (size_t i = 0; i < h.bounds.size() && i < h.counts.size(); ++i) cumulative[i] = acc += h.counts[i];
      e.histogram(name, help, label(c), h.bounds, cumulative, h.count, &h.sum);
    }
  };
  hist("metro_class_ttft_seconds", "Time to first token by SLA class.", &sched::ClassMetricsSnapshot::ttft_s);
  hist("metro_class_tpot_seconds", "Time per output token by SLA class.", &sched::ClassMetricsSnapshot::tpot_s);
  hist("metro_class_e2e_seconds", "End-to-end latency by SLA class.", &sched::ClassMetricsSnapshot::e2e_s);
  using C = sched::ClassMetricsSnapshot;
  auto per_class = [&](const char* name, bool counter, const char* help, auto value) {
    for (size_t c = 0; c < s.classes.size(); ++c) {
      const double v = value(s.classes[c]);
      if (counter) {
        e.counter(name, help, label(c), v);
      } else {
        e.gauge(name, help, label(c), v);
      }
    }
  };
  per_class("metro_class_finished_total", true, "Requests finished, by SLA class.",
            [](const C& c) { return static_cast<double>(c.finished); });
  per_class("metro_class_slo_met_total", true, "Finished requests that met both TTFT and TPOT objectives.",
            [](const C& c) { return static_cast<double>(c.slo_met); });
  per_class("metro_class_slo_attainment", false, "slo_met / finished.", [](const C& c) { return c.slo_attainment; });
  per_class("metro_class_waiting", false, "Sequences waiting, by SLA class.",
            [](const C& c) { return static_cast<double>(c.waiting); });
  per_class("metro_class_running", false, "Sequences running, by SLA class.",
            [](const C& c) { return static_cast<double>(c.running); });
  per_class("metro_class_preemptions_total", true, "Preemptions, by SLA class.",
            [](const C& c) { return static_cast<double>(c.preemptions); });
  per_class("metro_class_fair_share_preemptions_total", true,
            "Preemptions that gave a tenant below its share of seats one of another tenant's, by SLA class.",
            [](const C& c) { return static_cast<double>(c.fair_share_preemptions); });
  // The output-length predictor's accuracy over its recent window, per class and over all.
  using P = sched::PredictionAccuracy::Snapshot;
  auto predictor = [&](const char* name, const char* help, auto value) {
    for (size_t c = 0; c < s.classes.size(); ++c) e.gauge(name, help, label(c), value(s.classes[c].predictor));
    e.gauge(name, help, metrics::labels({{"model", model}}), value(s.predictor));
  };
  predictor("metro_predictor_samples", "Finished requests in the output-length predictor's accuracy window.",
            [](const P& p) { return static_cast<double>(p.n); });
  predictor("metro_predictor_rank_correlation", "Spearman rank correlation of predicted vs actual output length.",
            [](const P& p) { return p.spearman; });
  predictor("metro_predictor_within_100_tokens", "Fraction of predictions within 100 tokens of the actual length.",
            [](const P& p) { return p.within_100; });
  predictor("metro_predictor_mean_abs_error_tokens", "Mean absolute error of predicted output length, in tokens.",
            [](const P& p) { return p.mean_abs_error; });
}

// Precision tiers: which is active, switches and rollbacks, the quality monitor's measures.
void write_tier_metrics(metrics::Exposition& e, const std::string& model, const EngineStats& st) {
  const std::string l = metrics::labels({{"model", model}});
  for (int t = 0; t < adaptive::kNumTiers; ++t) {
    const auto tier = static_cast<adaptive::Tier>(t);
    const std::string lt = metrics::labels({{"model", model}, {"tier", adaptive::tier_name(tier)}});
    const size_t ti = static_cast<size_t>(t);
    e.gauge("metro_precision_tier_active", "1 for the precision tier requests not pinned to one run in.", lt,
            st.tier.tier == tier ? 1.0 : 0.0);
    e.gauge("metro_precision_tier_bytes", "Weight bytes of each precision tier.", lt,
            static_cast<double>(st.tier_bytes[ti]));
    e.counter("metro_precision_tier_passes_total", "Forward passes run by each precision tier.", lt,
              static_cast<double>(st.tier_steps[ti]));
    e.counter("metro_precision_tier_tokens_total", "Tokens computed by each precision tier.", lt,
              static_cast<double>(st.tier_tokens[ti]));
  }
  for (int m = 0; m < adaptive::kNumLoadModes; ++m) {
    const auto mode = static_cast<adaptive::LoadMode>(m);
    e.gauge("metro_precision_load_mode", "1 for the adaptive controller's load mode.",
            metrics::labels({{"model", model}, {"mode", adaptive::load_mode_name(mode)}}), st.tier.mode == mode ? 1.0 : 0.0);
  }
  e.gauge("metro_precision_pressure", "The adaptive controller's load pressure (1: at an objective).", l,
          st.tier.pressure);
  e.gauge("metro_precision_step_scale",
          "The adaptive controller's batch budget: the factor the scheduler's step length is scaled by.", l,
          st.tier.step_scale);
  e.counter("metro_precision_switches_total", "Switches of the active precision tier.", l,
            static_cast<double>(st.tier.switches));
  e.counter("metro_precision_switches_deferred_total", "Tier switches held back by the per-minute bound.", l,
            static_cast<double>(st.tier.switches_deferred));
  std::map<std::string, uint64_t> rollbacks = st.tier.rollbacks;
  rollbacks.try_emplace("shadow_kl", 0);
  rollbacks.try_emplace("drift", 0);
  for (const auto& [cause, n] : rollbacks) {
    e.counter("metro_precision_rollbacks_total", "Rollbacks to the high tier, by cause.",
              metrics::labels({{"model", model}, {"cause", cause}}), static_cast<double>(n));
  }
  e.gauge("metro_precision_shadow_kl",
          "Mean KL divergence (nats) of the low tier from the high tier over recent shadow-scored outputs.", l,
          st.shadow.kl_mean);
  e.gauge("metro_precision_shadow_top1_agreement",
          "Fraction of positions where both tiers' top token agrees, over recent shadow-scored outputs.", l,
          st.shadow.top1_mean);
  for (size_t layer = 0; layer < st.shadow.layer_drift.size(); ++layer) {
    e.gauge("metro_precision_layer_drift",
            "Per-layer drift of the low tier's activations (scale and outliers) from the high tier's on shadow-scored "
            "outputs: mean |log ratio|, 0 when they agree.",
            metrics::labels({{"model", model}, {"layer", std::to_string(layer)}}), st.shadow.layer_drift[layer]);
  }
  e.counter("metro_precision_shadow_scored_total", "Low-tier outputs scored again by both tiers.", l,
            static_cast<double>(st.shadow.scored));
  e.counter("metro_precision_shadow_dropped_total", "Low-tier outputs sampled but not scored (queue full, too long).",
            l, static_cast<double>(st.shadow.dropped));
}

}  // namespace

metrics::Registration Engine::export_metrics(metrics::Registry& registry, const std::string& model_label) const {
  return export_metrics(registry, std::make_shared<const metrics::SharedLabel>(model_label));
}

metrics::Registration Engine::export_metrics(metrics::Registry& registry,
                                             std::shared_ptr<const metrics::SharedLabel> label) const {
  const Engine* self = this;
  return registry.add([self, label](metrics::Exposition& e) {
    const EngineStats st = self->stats();
    const std::string model_label = label->get();
    const std::string l = metrics::labels({{"model", model_label}});
    auto gauge = [&](const char* name, const char* help, double v) { e.gauge(name, help, l, v); };
    auto counter = [&](const char* name, const char* help, double v) { e.counter(name, help, l, v); };
    gauge("metro_requests_waiting", "Sequences waiting to be scheduled.", st.waiting);
    gauge("metro_requests_running", "Sequences running (holding KV blocks).", st.running);
    gauge("metro_kv_blocks_used", "KV cache blocks referenced by sequences.", st.kv_blocks_used);
    gauge("metro_kv_blocks_capacity", "KV cache blocks in the pool.", st.kv_blocks_total);
    gauge("metro_kv_blocks_cached", "KV cache blocks holding prefix-cache entries.", st.kv_blocks_cached);
    gauge("metro_kv_usage_ratio", "Fraction of the KV cache's blocks referenced by sequences (0 to 1).",
          st.kv_blocks_total > 0 ? static_cast<double>(st.kv_blocks_used) / st.kv_blocks_total : 0.0);
    gauge("metro_kv_capacity_tokens", "Tokens the KV cache holds.", static_cast<double>(self->kv_capacity_tokens()));
    counter("metro_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            static_cast<double>(st.prefix_queries));
    counter("metro_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            static_cast<double>(st.prefix_hits));
    if (st.spill) {
      const kv::FileSpillStats& sp = *st.spill;
      counter("metro_prefix_cache_restored_tokens_total",
              "Prompt tokens found in the KV spill tier and read back instead of computed (among the hits).",
              static_cast<double>(st.restored_tokens));
      gauge("metro_kv_spill_blocks", "KV blocks held in the spill file.", static_cast<double>(sp.blocks));
      gauge("metro_kv_spill_bytes", "Bytes of KV blocks held in the spill file.", static_cast<double>(sp.bytes));
      gauge("metro_kv_spill_capacity_blocks", "KV blocks the spill file may hold (--kv-spill-bytes).",
            static_cast<double>(sp.capacity_blocks));
      counter("metro_kv_spill_writes_total", "KV blocks written to the spill file.", static_cast<double>(sp.writes));
      counter("metro_kv_spill_dropped_total",
              "Evicted KV blocks the spill tier did not keep (its writer behind, or off after a failed write).",
              static_cast<double>(sp.dropped));
      counter("metro_kv_spill_restores_total", "KV blocks read back from the spill tier.",
              static_cast<double>(sp.restores));
      counter("metro_kv_spill_restore_bytes_total", "Bytes read back from the spill file.",
              static_cast<double>(sp.restore_bytes));
      counter("metro_kv_spill_restore_seconds_total", "Time spent reading KV blocks back from the spill file.",
              sp.restore_seconds);
      counter("metro_kv_spill_corrupt_total", "Spilled KV blocks dropped because their bytes failed the checksum.",
              static_cast<double>(sp.corrupt));
      counter("metro_kv_spill_prefetched_total", "KV blocks read from the spill file ahead of their restore, at admission.",
              static_cast<double>(sp.prefetched));
      counter("metro_kv_spill_prefetch_hits_total", "Restores served from a block read ahead at admission.",
              static_cast<double>(sp.prefetch_hits));
      gauge("metro_kv_spill_failed", "1 once a write to the spill file failed (the tier keeps nothing more).",
            sp.failed ? 1.0 : 0.0);
    }
    counter("metro_prompt_tokens_total", "Prompt tokens computed (prefix-cache hits excluded).",
            static_cast<double>(st.prompt_tokens));
    counter("metro_generation_tokens_total", "Tokens generated.", static_cast<double>(st.generated_tokens));
    counter("metro_spec_draft_tokens_total", "Draft tokens verified (speculative decoding).",
            static_cast<double>(st.draft_tokens));
    // Per source: every source with speculation on; the grammar's forced tokens (drafted
    // with or without it) once there are any.
    const bool forced = st.spec_proposed[static_cast<size_t>(speculative::DraftSource::kGrammar)] > 0;
    if (!st.spec_steps_by_k.empty() || forced) {
      for (int s = 1; s < speculative::kNumDraftSources; ++s) {
        const auto src = static_cast<speculative::DraftSource>(s);
        const std::string ls =
            metrics::labels({{"model", model_label}, {"proposer", speculative::draft_source_name(src)}});
        e.counter("metro_spec_proposed_tokens_total", "Draft tokens verified, by where they came from.", ls,
                  static_cast<double>(st.spec_proposed[static_cast<size_t>(s)]));
        e.counter("metro_spec_accepted_tokens_total", "Draft tokens accepted, by where they came from.", ls,
                  static_cast<double>(st.spec_accepted[static_cast<size_t>(s)]));
      }
    }
    if (!st.spec_steps_by_k.empty()) {
      gauge("metro_spec_step_fixed_seconds", "Speculation controller: fitted fixed seconds of a step (0: not yet).",
            st.spec_fixed_s);
      gauge("metro_spec_draft_row_seconds", "Speculation controller: fitted seconds one draft row adds to a step.",
            st.spec_draft_row_s);
      for (size_t k = 0; k < st.spec_steps_by_k.size(); ++k) {
        e.counter("metro_spec_steps_total", "Decoding sequence-steps by the number of drafts they verified (k).",
                  metrics::labels({{"model", model_label}, {"k", std::to_string(k)}}),
                  static_cast<double>(st.spec_steps_by_k[k]));
      }
    }
    counter("metro_engine_steps_total", "Engine steps run.", static_cast<double>(st.steps));
    counter("metro_engine_major_page_faults_total",
            "Major page faults of the process (reads that waited for the disk) while this engine's forward passes ran.",
            static_cast<double>(st.major_page_faults));
    {
      const model::Model& m = self->model();
      const ByteRanges w = m.weight_memory();
      gauge("metro_weights_bytes",
            "Host memory the model's weights are read from (0 on a device backend; cold experts apart).",
            static_cast<double>(total_bytes(w)));
      gauge("metro_weights_resident_bytes", "Of metro_weights_bytes, the bytes in RAM now.",
            static_cast<double>(resident_bytes(w)));
      gauge("metro_weights_locked_bytes", "Weight bytes locked in RAM (metro serve --mlock).",
            static_cast<double>(m.weights_locked()));
      gauge("metro_weights_file_given_back_bytes",
            "Bytes of the model file's in-memory copy given back after loading (weights the backend copied).",
            static_cast<double>(m.file_given_back()));
      if (const ColdStore* cs = m.cold_store()) {
        const ColdStore::Stats c = cs->stats();
        gauge("metro_weights_budget_bytes", "The cap on this model's resident weights (metro serve --mem-budget).",
              static_cast<double>(m.mem_budget()));
        gauge("metro_weights_cold_bytes", "Weights kept in the cold file behind the page cache (experts, the embedding table).",
              static_cast<double>(c.bytes));
        gauge("metro_weights_cold_mapped_bytes",
              "Of metro_weights_cold_bytes, the bytes read since they were last given back.",
              static_cast<double>(c.mapped));
        gauge("metro_weights_cold_mapped_limit_bytes",
              "What the budget leaves for cold weights mapped in (the budget less metro_weights_bytes).",
              static_cast<double>(c.budget));
        counter("metro_weights_cold_releases_total", "Cold pieces (an expert matrix, 64 KiB of embedding rows) given back, least recently read first.",
                static_cast<double>(c.releases));
        counter("metro_weights_cold_reads_total", "Cold pieces read in again after they were given back.",
                static_cast<double>(c.faults_in));
      }
    }
    counter("metro_preemptions_total", "Sequences preempted (for KV space, or a tenant's fair share of seats).",
            static_cast<double>(st.preemptions));
    counter("metro_requests_finished_total", "Engine requests that finished.",
            static_cast<double>(st.requests_finished));
    counter("metro_requests_aborted_total", "Engine requests aborted.", static_cast<double>(st.requests_aborted));
    counter("metro_requests_deadline_missed_total",
            "Engine requests ended because their deadline passed before their first output (503 deadline_missed).",
            static_cast<double>(st.requests_expired));
    gauge("metro_sched_step_budget_tokens", "Token budget of the last engine step (a policy may cut it to fit objectives).",
          st.scheduler.step_budget_tokens);
    const sched::StepCostModel& c = st.scheduler.step_cost;
    const char* cost_help =
        "Fitted step cost model: fixed, per token (prompt or decode), per prompt attention pair, per key a decode "
        "reads (0 until fitted).";
    for (const auto& [term, v] : {std::pair<const char*, double>{"fixed", c.fixed_s},
                                  {"per_prefill_token", c.per_prefill_token_s},
                                  {"per_decode_seq", c.per_decode_seq_s},
                                  {"per_attention_pair", c.per_attention_pair_s},
                                  {"per_decode_ctx", c.per_decode_ctx_s}}) {
      e.gauge("metro_engine_step_cost_seconds", cost_help, metrics::join(l, metrics::labels({{"term", term}})), v);
    }
    // Step time: the engine buckets milliseconds; exposed in seconds.
    std::vector<double> step_bounds;
    for (double b : EngineStats::step_ms_bounds()) step_bounds.push_back(b * 1e-3);
    const double step_sum = st.step_seconds_total;
    e.histogram("metro_engine_step_duration_seconds", "Duration of an engine step.", l, step_bounds,
                st.step_ms_buckets, st.steps, &step_sum);
    // The engine keeps no running sum of batch sizes, so this histogram has no _sum.
    e.histogram("metro_engine_batch_tokens", "Tokens in an engine step's batch.", l,
                EngineStats::batch_tokens_bounds(), st.batch_tokens_buckets, st.steps, nullptr);
    if (st.tiers) write_tier_metrics(e, model_label, st);
    write_class_metrics(e, model_label, self->sched_metrics().snapshot());
  });
}

}  // namespace metro::engine
