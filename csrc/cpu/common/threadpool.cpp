#include "common/threadpool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RMOE_PAUSE() _mm_pause()
#else
#define RMOE_PAUSE() std::this_thread::yield()
#endif

namespace rmoe {

namespace {

int usable_cores() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// How long an idle worker keeps polling for the next job before it sleeps. A decode
// step issues a few kernel calls per layer with short Python work in between: waking
// a sleeping thread each time costs more than the work of a small call.
std::chrono::microseconds spin_time() {
  const char* s = std::getenv("RAPIDMOE_SPIN_US");
  long us = 300;
  if (s && *s) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end && *end == '\0' && v >= 0 && v <= 1000000) us = v;
  }
  return std::chrono::microseconds(us);
}

// Work is handed out in chunks from a shared counter (dynamic scheduling): a thread
// that meets slower rows (or loses its core for a while) does not hold the others up.
// Each job's participants are threads 0..parts-1; the caller is thread 0 and returns
// when every participant has checked out, so no worker still reads the job after.
class Pool {
 public:
  explicit Pool(int n) : spin_(spin_time()) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return (int)workers_.size() + 1; }

  void resize(int n) {
    stop();
    stopping_ = false;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, g = generation_.load()] { loop(i, g); });
  }

  void run(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t min_chunk) {
    min_chunk = std::max<size_t>(1, min_chunk);
    const int nt = std::max<int>(1, (int)std::min<size_t>((size_t)size(), (n + min_chunk - 1) / min_chunk));
    if (nt <= 1) {
      fn(0, n, 0);
      return;
    }
    std::lock_guard<std::mutex> one_job(job_mutex_);  // jobs from several Python threads run one at a time
    fn_.store(&fn, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    chunk_.store(std::max(min_chunk, (n + 8 * (size_t)nt - 1) / (8 * (size_t)nt)), std::memory_order_relaxed);
    next_.store(0, std::memory_order_relaxed);
    pending_.store(nt - 1, std::memory_order_relaxed);
    // seq_cst: publishes the job; pairs with sleepers_ below. The low byte carries the
    // thread count, so a worker left out never reads the job's fields (they may be
    // rewritten for the next job while it looks).
    generation_.store(((generation_.load() >> 8) + 1) << 8 | (uint64_t)nt);
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lk(m_);
      cv_.notify_all();
    }
    work(0);
    while (pending_.load(std::memory_order_acquire) != 0) RMOE_PAUSE();
  }

 private:
  void work(int idx) {
    const auto* fn = fn_.load(std::memory_order_relaxed);
    const size_t n = n_.load(std::memory_order_relaxed), chunk = chunk_.load(std::memory_order_relaxed);
    for (;;) {
      const size_t b = next_.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n) break;
      (*fn)(b, std::min(n, b + chunk), idx);
    }
  }

  void loop(int idx, uint64_t seen) {
    for (;;) {
      uint64_t g = wait_for_job(seen);
      if (g == 0) return;  // stopping
      seen = g;
      if ((uint64_t)idx >= (g & 0xFF)) continue;  // this job uses fewer threads
      work(idx);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Returns the new generation, or 0 when the pool stops.
  uint64_t wait_for_job(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + spin_;
    for (int i = 0;; ++i) {
      const uint64_t g = generation_.load(std::memory_order_acquire);
      if (g != seen) return stopping_.load() ? 0 : g;
      if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) break;
      RMOE_PAUSE();
    }
    std::unique_lock<std::mutex> lk(m_);
    sleepers_.fetch_add(1);  // seq_cst: either run() sees us asleep or we see its generation
    cv_.wait(lk, [&] { return stopping_.load() || generation_.load() != seen; });
    sleepers_.fetch_sub(1);
    return stopping_.load() ? 0 : generation_.load(std::memory_order_acquire);
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
      generation_.store(((generation_.load() >> 8) + 1) << 8);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  const std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::mutex job_mutex_, m_;
  std::condition_variable cv_;
  std::atomic<const std::function<void(size_t, size_t, int)>*> fn_{nullptr};
  std::atomic<size_t> n_{0}, chunk_{1}, next_{0};
  std::atomic<int> pending_{0}, sleepers_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
};

std::mutex g_pool_mutex;
Pool* g_pool = nullptr;

Pool& pool() {
  std::lock_guard<std::mutex> lk(g_pool_mutex);
  if (!g_pool) g_pool = new Pool(std::min(255, usable_cores()));  // never destroyed: workers outlive static teardown safely
  return *g_pool;
}

}  // namespace

void set_num_threads(int n) {
  Pool& p = pool();
  const int want = std::min(255, n <= 0 ? usable_cores() : n);  // the job word holds the count in a byte
  if (want != p.size()) p.resize(want);
}

int num_threads() { return pool().size(); }

void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t min_chunk) {
  if (n == 0) return;
  pool().run(n, fn, min_chunk);
}

}  // namespace rmoe
