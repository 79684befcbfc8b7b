// Service-level objectives per request class, and whether a request met them.
//
// `--slo` takes a list of items METRIC=VALUE, optionally prefixed CLASS:, separated by ','
// (repeat --slo, or separate groups with ';', to write several):
//
//   --slo ttft=0.5,tpot=0.1                  every class: TTFT <= 0.5 s and TPOT <= 0.1 s
//   --slo realtime:ttft=0.3,tpot=0.05        class realtime only (tpot inherits "realtime:")
//   --slo 'ttft=2,e2e=60;realtime:ttft=300ms'
//
// An item without a class prefix belongs to the class of the item before it in the same
// group, or to every class if it starts the group. VALUE is seconds, or has an `s` or `ms`
// suffix. A class's own limits replace the all-class limit of the same metric; the other
// all-class limits still apply to it. Metrics:
//   ttft  time to first token
//   tpot  time per output token after the first
//   itl   the largest gap between two tokens of the request
//   e2e   end-to-end latency
// A request meets its SLO when it succeeded and every limit holds. A limit on a figure the
// request could not produce (TPOT of a one-token answer; TTFT, TPOT, ITL of a non-streamed
// request) holds vacuously, since there is nothing to judge.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "loadgen/request_record.h"

namespace metro::loadgen {

struct Slo {
  std::optional<double> ttft_s, tpot_s, itl_s, e2e_s;

  bool empty() const { return !ttft_s && !tpot_s && !itl_s && !e2e_s; }
  // "ttft<=0.5s tpot<=0.1s", or "none".
  std::string to_string() const;
  bool met_by(const RequestRecord& r) const;
};

class SloSet {
 public:
  static Expected<SloSet> parse(const std::vector<std::string>& specs);

  bool any() const;
  // The limits that apply to a class: its own over the all-class ones.
  Slo for_class(std::string_view class_name) const;
  const Slo& all_classes() const { return all_; }
  const std::map<std::string, Slo, std::less<>>& per_class() const { return per_class_; }

 private:
  Slo all_;
  std::map<std::string, Slo, std::less<>> per_class_;
};

}  // namespace metro::loadgen
