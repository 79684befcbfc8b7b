#include "support/test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace metro::testing {

// METRO_SOURCE_DIR and METRO_BIN_DIR in the environment override the build's paths: for
// a test binary carried to another machine (scripts/gpu_check.sh).
std::string source_path(const std::string& relative) {
  if (const char* env = std::getenv("METRO_SOURCE_DIR")) return std::string(env) + "/" + relative;
  return std::string(METRO_SOURCE_DIR) + "/" + relative;
}

std::string default_model_path() {
  if (const char* env = std::getenv("METRO_MODEL")) return env;
  return source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

std::string gemma3_model_path() {
  if (const char* env = std::getenv("METRO_GEMMA3_MODEL")) return env;
  return source_path("models/gemma-3-270m-q4_k_m.gguf");
}

bool have_gemma3_model() {
  struct stat st {};
  return ::stat(gemma3_model_path().c_str(), &st) == 0 && st.st_size > 0;
}

std::string minilm_dir() {
  if (const char* env = std::getenv("METRO_MINILM_DIR")) return env;
  return source_path("models/all-MiniLM-L6-v2");
}

bool have_minilm() {
  struct stat st {};
  return ::stat((minilm_dir() + "/model.safetensors").c_str(), &st) == 0 && st.st_size > 0;
}

bool have_default_model() {
  struct stat st {};
  return ::stat(default_model_path().c_str(), &st) == 0 && st.st_size > 0;
}

TempFile::TempFile(const std::string& suffix) {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TMPDIR");
  path_ = std::string(tmp ? tmp : "/tmp") + "/metro_test_" + std::to_string(::getpid()) + "_" +
          std::to_string(counter++) + suffix;
}

TempFile::~TempFile() { ::unlink(path_.c_str()); }

void TempFile::write(std::span<const uint8_t> bytes) const {
  std::ofstream f(path_, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write temp file");
}

void TempFile::write(const std::string& text) const {
  write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// posix_spawn, not fork: the test process has threads (a fake server, an engine), and a
// forked child that allocates before exec can inherit a lock another thread held at the
// fork and wait on it forever (seen once under ASan in CI: a 900 s ctest timeout).
// A child that runs past the watchdog is killed, so a hang fails with its output instead.
CommandResult run_metro(const std::vector<std::string>& args, const std::string& stdin_file) {
  constexpr int kWatchdogMs = 600 * 1000;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe");
  }
  const char* bin_dir = std::getenv("METRO_BIN_DIR");
  std::string bin = std::string(bin_dir != nullptr ? bin_dir : METRO_BIN_DIR) + "/metro";
  std::vector<char*> argv;
  argv.push_back(bin.data());
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);  // dup2 clears FD_CLOEXEC
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  if (!stdin_file.empty()) posix_spawn_file_actions_addopen(&actions, 0, stdin_file.c_str(), O_RDONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, bin.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  CommandResult r;
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    r.err = "posix_spawn " + bin + " failed: " + std::to_string(rc);
    return r;
  }
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWatchdogMs);
  bool killed = false;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 && !killed) {
      ::kill(pid, SIGKILL);
      killed = true;
      r.err += "\n[run_metro: killed after " + std::to_string(kWatchdogMs / 1000) + " s]\n";
    }
    const int ready = poll(fds, 2, killed ? 1000 : static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[k].fd, buf, sizeof(buf));
      if (n <= 0) {
        close(fds[k].fd);
        fds[k].fd = -1;
        --open_fds;
      } else {
        (k == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

std::string disk_dir() {
  std::vector<std::string> dirs;
  if (const char* t = std::getenv("TMPDIR")) dirs.emplace_back(t);
  for (const char* d : {"/var/tmp", "/tmp", "."}) dirs.emplace_back(d);
  for (const std::string& d : dirs) {
    struct statfs fs {};
    if (statfs(d.c_str(), &fs) == 0 && fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC &&
        ::access(d.c_str(), W_OK) == 0) {
      return d;
    }
  }
  return ".";
}

uint64_t mapped_rss(const std::string& path) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool mine = false;
  uint64_t kib = 0;
  while (std::getline(in, line)) {
    // A mapping's header: "start-end perms offset dev inode [path]"; its fields follow.
    const std::string first = line.substr(0, line.find(' '));
    const bool header = first.find('-') != std::string::npos &&
                        first.find_first_not_of("0123456789abcdef-") == std::string::npos;
    if (header) {
      mine = line.find(path) != std::string::npos;
    } else if (mine && line.rfind("Rss:", 0) == 0) {
      kib += std::strtoull(line.c_str() + 4, nullptr, 10);
    }
  }
  return kib * 1024;
}

}  // namespace metro::testing
