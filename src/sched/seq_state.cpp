#include "sched/seq_state.h"

namespace metro::sched {

const char* sla_class_name(SlaClass c) {
  switch (c) {
    case SlaClass::kRealtime: return "realtime";
    case SlaClass::kStandard: return "standard";
    case SlaClass::kBatch: return "batch";
  }
  return "standard";
}

bool parse_sla_class(const std::string& s, SlaClass* out) {
  if (s == "realtime") *out = SlaClass::kRealtime;
  else if (s == "standard") *out = SlaClass::kStandard;
  else if (s == "batch") *out = SlaClass::kBatch;
  else return false;
  return true;
}

}  // namespace metro::sched
