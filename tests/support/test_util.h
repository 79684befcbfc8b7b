// Helpers shared by tests: paths to the default model, temporary files, running the CLI.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace metro::testing {

// models/SmolLM2-135M-Instruct.Q4_1.gguf in the source tree (METRO_MODEL overrides).
std::string default_model_path();
// Gemma 3 270M Q4_K_M (`make model-gemma3`), the real file of the gemma3 architecture.
std::string gemma3_model_path();
bool have_gemma3_model();
// all-MiniLM-L6-v2 as Hugging Face ships it (`make model-minilm`): a directory with
// config.json, model.safetensors and tokenizer.json; METRO_MINILM_DIR overrides.
std::string minilm_dir();
bool have_minilm();
// True when the default model is present; tests that need it call REQUIRE_MODEL().
bool have_default_model();

// A file under the test temp dir, removed when the object dies.
class TempFile {
 public:
  explicit TempFile(const std::string& suffix = ".gguf");
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }
  void write(std::span<const uint8_t> bytes) const;
  void write(const std::string& text) const;

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;       // -1 when killed by a signal
  int signal = 0;           // the signal, if any
  std::string out;          // stdout
  std::string err;          // stderr
};

// Runs build/bin/metro with arguments (no shell), capturing stdout and stderr; stdin is the
// file `stdin_file` when given (else the test's own).
CommandResult run_metro(const std::vector<std::string>& args, const std::string& stdin_file = {});

std::string source_path(const std::string& relative);

// A writable directory on a disk (not tmpfs): TMPDIR, /var/tmp, /tmp or ".", the first
// that is (a cold store refuses memory-backed ones).
std::string disk_dir();
// Resident bytes of this process's mappings of the file at `path` (an unlinked one shows
// as "PATH (deleted)"), summed from /proc/self/smaps.
uint64_t mapped_rss(const std::string& path);

}  // namespace metro::testing

// Fails (not skips) when the Gemma 3 file is absent: `make test` fetches it first.
#define REQUIRE_GEMMA3()                                                                     \
  do {                                                                                       \
    if (!::metro::testing::have_gemma3_model())                                              \
      GTEST_FAIL() << "Gemma 3 model missing: run `make model-gemma3` (or set METRO_GEMMA3_MODEL)"; \
  } while (0)

// Fails (not skips) when the MiniLM directory is absent: `make test` fetches it first.
#define REQUIRE_MINILM()                                                                     \
  do {                                                                                       \
    if (!::metro::testing::have_minilm())                                                    \
      GTEST_FAIL() << "all-MiniLM-L6-v2 missing: run `make model-minilm` (or set METRO_MINILM_DIR)"; \
  } while (0)

// Fails (not skips) when the default model is absent: `make test` fetches it first.
#define REQUIRE_MODEL()                                                             \
  do {                                                                              \
    if (!::metro::testing::have_default_model())                                    \
      GTEST_FAIL() << "default model missing: run `make model` (or set METRO_MODEL)"; \
  } while (0)
