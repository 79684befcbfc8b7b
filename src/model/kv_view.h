// The model's window onto KV memory for one step: backends::KvView (backends/kv_view.h
// describes the layout). It lives below the model because the backends that execute a step
// read and write the pages; kv/ sits above the model and fills it.
#pragma once

#include "backends/kv_view.h"

namespace metro::model {

using KvView = backends::KvView;

}  // namespace metro::model
