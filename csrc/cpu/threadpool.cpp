#include "threadpool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>

namespace rmoe {

namespace {

int usable_cores() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return (int)workers_.size() + 1; }

  void resize(int n) {
    stop();
    stopping_ = false;
    // new workers start at the current generation: a job that already ran is not theirs
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, g = generation_] { loop(i, g); });
  }

  void run(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t min_chunk) {
    const int nt = std::max<int>(1, std::min<size_t>((size_t)size(), (n + min_chunk - 1) / std::max<size_t>(1, min_chunk)));
    if (nt <= 1) {
      fn(0, n, 0);
      return;
    }
    std::lock_guard<std::mutex> one_job(job_mutex_);  // jobs from several Python threads run one at a time
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = &fn;
      n_ = n;
      parts_ = nt;
      pending_ = nt - 1;
      ++generation_;
    }
    cv_.notify_all();
    fn(0, n / nt, 0);
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void loop(int idx, uint64_t seen) {
    for (;;) {
      const std::function<void(size_t, size_t, int)>* fn;
      size_t n;
      int parts;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        if (idx >= parts_) continue;  // this job uses fewer threads
        fn = fn_;
        n = n_;
        parts = parts_;
      }
      (*fn)(n * idx / parts, n * (idx + 1) / parts, idx);
      std::lock_guard<std::mutex> lk(m_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_, m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t, size_t, int)>* fn_ = nullptr;
  size_t n_ = 0;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

std::mutex g_pool_mutex;
Pool* g_pool = nullptr;

Pool& pool() {
  std::lock_guard<std::mutex> lk(g_pool_mutex);
  if (!g_pool) g_pool = new Pool(usable_cores());  // never destroyed: workers outlive static teardown safely
  return *g_pool;
}

}  // namespace

void set_num_threads(int n) {
  Pool& p = pool();
  const int want = n <= 0 ? usable_cores() : n;
  if (want != p.size()) p.resize(want);
}

int num_threads() { return pool().size(); }

void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t min_chunk) {
  if (n == 0) return;
  pool().run(n, fn, min_chunk);
}

}  // namespace rmoe
