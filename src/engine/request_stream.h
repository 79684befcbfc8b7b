// A request's output: a bounded queue of events from the engine thread to one consumer.
//
// The engine never blocks on a consumer: push() fails when the queue is full, and the
// engine then aborts the request (a client that stops reading cannot hold memory hostage).
// A consumer either waits (pop with timeout) or registers a notify callback, called on the
// engine thread after pushes, which must only schedule work (e.g. post to an I/O loop).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "engine/request.h"

namespace metro::engine {

class RequestStream {
 public:
  RequestStream(uint64_t id, size_t capacity) : id_(id), capacity_(capacity) {}

  uint64_t id() const { return id_; }

  // Engine side. False when full (the event is dropped).
  bool push(Event e);
  // Engine side: the last event; always accepted (one slot is reserved for it).
  void push_final(Event e);

  // Consumer side.
  std::optional<Event> try_pop();
  std::optional<Event> pop(std::chrono::milliseconds timeout);
  // Drains everything available into `out`; true when the stream has ended (kDone seen).
  bool drain(std::deque<Event>* out);
  void set_notify(std::function<void()> fn);
  bool finished() const;

 private:
  void notify_locked(std::unique_lock<std::mutex>& lock);

  const uint64_t id_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
  std::function<void()> notify_;
  bool done_pushed_ = false;
  bool done_popped_ = false;
};

}  // namespace metro::engine
