// The part of libzmq's C API metro uses (the KV-event publisher and the router's
// subscriber), resolved from libzmq.so.5 at run time: metro builds and runs without the
// library, and only the flags that need it ask for it. The constants are the library's
// stable ABI values (zmq.h).
#pragma once

#include <dlfcn.h>

#include <memory>
#include <string>
#include <type_traits>

#include "base/status.h"

namespace metro {

struct ZmqLib {
  static constexpr int kPub = 1, kSub = 2, kRouter = 6;
  static constexpr int kSndMore = 2, kDontWait = 1;
  static constexpr int kSubscribe = 6, kLinger = 17, kSndHwm = 23, kRcvMore = 13, kRcvTimeo = 27;
  static constexpr short kPollIn = 1;
  struct PollItem {
    void* socket;
    int fd;
    short events;
    short revents;
  };

  void* lib = nullptr;
  void* (*ctx_new)() = nullptr;
  int (*ctx_term)(void*) = nullptr;
  void* (*socket)(void*, int) = nullptr;
  int (*close)(void*) = nullptr;
  int (*setsockopt)(void*, int, const void*, size_t) = nullptr;
  int (*getsockopt)(void*, int, void*, size_t*) = nullptr;
  int (*bind)(void*, const char*) = nullptr;
  int (*connect)(void*, const char*) = nullptr;
  int (*send)(void*, const void*, size_t, int) = nullptr;
  int (*recv)(void*, void*, size_t, int) = nullptr;
  int (*poll)(PollItem*, int, long) = nullptr;
  int (*errno_)() = nullptr;
  const char* (*strerror)(int) = nullptr;

  ~ZmqLib() {
    if (lib != nullptr) dlclose(lib);
  }
  std::string error() const { return strerror(errno_()); }

  // `who` (a flag) names what needs the library in the errors.
  static Expected<std::shared_ptr<ZmqLib>> load(const std::string& who) {
    auto z = std::make_shared<ZmqLib>();
    for (const char* name : {"libzmq.so.5", "libzmq.so"}) {
      z->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (z->lib != nullptr) break;
    }
    if (z->lib == nullptr) {
      return unavailable(who + " needs libzmq (Debian: apt-get install libzmq5), which is not installed");
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(z->lib, name));
      ok = ok && fn != nullptr;
    };
    sym(z->ctx_new, "zmq_ctx_new");
    sym(z->ctx_term, "zmq_ctx_term");
    sym(z->socket, "zmq_socket");
    sym(z->close, "zmq_close");
    sym(z->setsockopt, "zmq_setsockopt");
    sym(z->getsockopt, "zmq_getsockopt");
    sym(z->bind, "zmq_bind");
    sym(z->connect, "zmq_connect");
    sym(z->send, "zmq_send");
    sym(z->recv, "zmq_recv");
    sym(z->poll, "zmq_poll");
    sym(z->errno_, "zmq_errno");
    sym(z->strerror, "zmq_strerror");
    if (!ok) return unavailable("the libzmq found lacks functions " + who + " uses (libzmq 4 is needed)");
    return z;
  }
};

}  // namespace metro
