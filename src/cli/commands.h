// Subcommands of the `metro` binary. Each takes the arguments after its name
// (argv[0] is the subcommand name) and returns the process exit code.
#pragma once

namespace metro::cli {

int cmd_inspect(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_embed(int argc, char** argv);
int cmd_router(int argc, char** argv);
int cmd_sensitivity(int argc, char** argv);
int cmd_bench_serve(int argc, char** argv);

}  // namespace metro::cli
