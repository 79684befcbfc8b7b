#include "support/test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace metro::testing {

std::string source_path(const std::string& relative) {
  return std::string(METRO_SOURCE_DIR) + "/" + relative;
}

std::string default_model_path() {
  if (const char* env = std::getenv("METRO_MODEL")) return env;
  return source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
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

CommandResult run_metro(const std::vector<std::string>& args) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe");
  std::string bin = std::string(METRO_BIN_DIR) + "/metro";
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    std::vector<char*> argv;
    argv.push_back(bin.data());
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  CommandResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) break;
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
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

}  // namespace metro::testing
