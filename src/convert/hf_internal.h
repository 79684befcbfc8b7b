// Shared by the tokenizer converter's files: reading Hugging Face's JSON files safely
// (bounded size and nesting, typed member access), and naming a byte-level BPE's
// pre-tokenizer. Internal to src/convert.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace metro::convert::hf {

using nlohmann::json;

// Nothing nested deeper than `max_depth`, so no reader recurses far on hostile input.
bool depth_ok(std::string_view text, int max_depth);
// `text` parsed, refused when nested too deep or malformed; `name` prefixes errors.
Expected<json> parse_json(std::string_view text, const std::string& name);
// The file's text, nullopt when it does not exist; refused past `max_bytes`.
Expected<std::optional<std::string>> read_file(const std::string& path, const std::string& name, size_t max_bytes);
// obj[key] unless absent or null (nullptr then, also when obj is no object).
const json* member(const json& obj, const char* key);
// A token named in a config file: "[CLS]" or {"content": "[CLS]", ...}.
std::optional<std::string> token_name(const json* obj, const char* key);
// obj["type"] as a string ("" when none).
std::string type_of(const json& obj);
// obj[key] when a boolean, else `dflt`.
bool bool_or(const json& obj, const char* key, bool dflt);

// A byte-level BPE as GPT-2, Llama 3, Qwen and SmolLM save it (`root`: tokenizer.json,
// `model`: its "model"): the GGUF `pre` of the split found (gpt-2, starcoder, llama-bpe,
// smaug-bpe, qwen2), refused with the reason when metro's pre-tokenizers do not reproduce
// it; settings the GGUF does not carry become `warnings`.
Expected<std::string> byte_level_bpe_pre(const json& root, const json& model, std::vector<std::string>& warnings);

}  // namespace metro::convert::hf
