// metro convert HF_DIR OUT.gguf [--type f16|f32|bf16|q8_0|q4_0|...]
//
// Writes a Hugging Face checkpoint directory (config.json, model.safetensors or its shards,
// tokenizer.json or tokenizer.model) as a GGUF that metro and llama.cpp load: llama,
// mistral, mixtral, qwen2(-moe), qwen3(-moe), phi3, gemma, gemma2 and gemma3 decoders and BERT-family
// encoders (convert/convert.h).
// Matrices in --type, everything else F32; the output is streamed a tensor at a time to a
// temporary file and renamed, so a failed run leaves no partial file and a checkpoint
// larger than memory converts.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "convert/convert.h"
#include "model/requantize.h"

namespace metro::cli {

int cmd_convert(int argc, char** argv) {
  CLI::App app{"Convert a Hugging Face model directory (safetensors) to GGUF", "metro convert"};
  std::string in_dir, out_path, type_name = "f16";
  app.add_option("input", in_dir, "Hugging Face model directory (config.json, model.safetensors, tokenizer.json)")
      ->required();
  app.add_option("output", out_path, "GGUF file to write")->required();
  app.add_option("--type", type_name,
                 "format of the weight matrices (f32, f16, bf16, q8_0, q4_0, q4_k, ...), or llama.cpp's q4_k_m / q5_k_m mix")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  convert::ConvertOptions opts;
  if (model::is_quant_preset_name(type_name)) {
    opts.preset = type_name;
    opts.type = model::preset_plan(type_name, {})->type.value();
  } else {
    auto type = model::quant_format_named(type_name, "--type");
    if (!type.ok()) return fail("convert", type.status());
    if (*type == model::kKeepFormat) return fail("convert", invalid_argument("--type keep has no meaning here"));
    opts.type = *type;
  }
  std::unique_ptr<Progress> progress;  // made once the checkpoint's size is known
  uint64_t shown = 0;
  opts.on_tensor = [&](uint64_t done, uint64_t total, std::string_view name) {
    if (!progress) progress = std::make_unique<Progress>("convert", total);
    progress->advance(done - shown, name);
    shown = done;
  };
  convert::ConvertReport rep;
  const Status st = convert::convert_hf_to_file(in_dir, out_path, opts, &rep);
  if (progress) progress->finish();
  if (!st.ok()) return fail("convert", st);
  for (const std::string& warning : rep.warnings) std::fprintf(stderr, "metro convert: note: %s\n", warning.c_str());
  std::fprintf(stderr, "metro convert: %s, %d tensors, %d tokens, matrices %s: %.1f MiB -> %.1f MiB (%s)\n",
               rep.architecture.c_str(), rep.n_tensors, rep.n_vocab, type_name.c_str(),
               static_cast<double>(rep.source_bytes) / (1 << 20), static_cast<double>(rep.bytes) / (1 << 20),
               out_path.c_str());
  return 0;
}

}  // namespace metro::cli
