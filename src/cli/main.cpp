// metro: one binary, many subcommands (git style).
#include <cstdio>
#include <cstring>
#include <string_view>

#include "cli/commands.h"
#include "kernels/matmul.h"

#ifndef METRO_VERSION
#define METRO_VERSION "0.0.0"
#endif
#ifndef METRO_GIT_COMMIT
#define METRO_GIT_COMMIT "unknown"
#endif
#ifndef METRO_BUILD_TYPE
#define METRO_BUILD_TYPE "unknown"
#endif

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"serve", metro::cli::cmd_serve, "serve a model over an OpenAI-compatible HTTP API"},
    {"run", metro::cli::cmd_run, "generate text from a prompt"},
    {"chat", metro::cli::cmd_chat, "chat with a model in the terminal"},
    {"bench", metro::cli::cmd_bench, "measure prompt processing and generation speed"},
    {"perplexity", metro::cli::cmd_perplexity, "perplexity of a model over a text file"},
    {"sensitivity", metro::cli::cmd_sensitivity, "what lowering each weight matrix costs; a plan for a byte budget"},
    {"quantize", metro::cli::cmd_quantize, "rewrite a model's weight matrices in another format"},
    {"convert", metro::cli::cmd_convert, "write a Hugging Face model directory (safetensors) as GGUF"},
    {"embed", metro::cli::cmd_embed, "embed texts, one normalized vector per line"},
    {"router", metro::cli::cmd_router, "route OpenAI requests over metro replicas"},
    {"inspect", metro::cli::cmd_inspect, "print a GGUF model's architecture, tokenizer, tensors"},
    {"tokenize", metro::cli::cmd_tokenize, "print the token ids and pieces of a text"},
    {"bench-serve", metro::cli::cmd_bench_serve, "load-test an OpenAI-compatible server"},
};

// `metro --version` / `metro version`: what a bug report needs.
int print_version() {
  std::printf("metro %s (commit %s, %s build, kernels %.*s)\n", METRO_VERSION, METRO_GIT_COMMIT, METRO_BUILD_TYPE,
              static_cast<int>(metro::kernels::kernel_isa().size()), metro::kernels::kernel_isa().data());
  return 0;
}

void usage(FILE* out) {
  std::fprintf(out, "metro: an LLM inference server\n\nusage: metro <command> [options]\n\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "  %-12s %s\n", "version", "print the version, commit, build type and kernel ISA");
  std::fprintf(out, "\n`metro <command> --help` describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") return print_version();
  for (const auto& c : kCommands) {
    if (cmd == c.name) return c.fn(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "metro: unknown command '%.64s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
