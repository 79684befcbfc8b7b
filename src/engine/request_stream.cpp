#include "engine/request_stream.h"

namespace metro::engine {

void RequestStream::notify_locked(std::unique_lock<std::mutex>& lock) {
  std::function<void()> fn = notify_;
  lock.unlock();
  cv_.notify_all();
  if (fn) fn();
}

bool RequestStream::push(Event e) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_pushed_ || q_.size() + 1 >= capacity_) return false;  // keep one slot for the end
  q_.push_back(std::move(e));
  notify_locked(lock);
  return true;
}

void RequestStream::push_final(Event e) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_pushed_) return;
  if (e.kind == Event::Kind::kDone) done_pushed_ = true;
  q_.push_back(std::move(e));
  notify_locked(lock);
}

std::optional<Event> RequestStream::try_pop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (q_.empty()) return std::nullopt;
  Event e = std::move(q_.front());
  q_.pop_front();
  if (e.kind == Event::Kind::kDone) done_popped_ = true;
  return e;
}

std::optional<Event> RequestStream::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return std::nullopt;
  Event e = std::move(q_.front());
  q_.pop_front();
  if (e.kind == Event::Kind::kDone) done_popped_ = true;
  return e;
}

bool RequestStream::drain(std::deque<Event>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!q_.empty()) {
    if (q_.front().kind == Event::Kind::kDone) done_popped_ = true;
    out->push_back(std::move(q_.front()));
    q_.pop_front();
  }
  return done_popped_;
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  notify_ = std::move(fn);
  const bool pending = !q_.empty();
  lock.unlock();
  if (pending && notify_) notify_();
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_popped_;
}

}  // namespace metro::engine
