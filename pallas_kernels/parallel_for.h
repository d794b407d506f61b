// ParallelFor and ParallelRuns: the native CPU kernels' split of independent work over XLA's intra-op thread pool.
#ifndef JAXLLM_PALLAS_KERNELS_PARALLEL_FOR_H_
#define JAXLLM_PALLAS_KERNELS_PARALLEL_FOR_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxllm {

// Runs work(i) for i in 0 .. n on the calling thread and on the pool's threads. Returns once every item is done;
// a pool task that starts later finds no item left and touches nothing but the shared counters.
//
// The calling thread works too, so it asks for one helper fewer than the pool has threads: XLA's intra-op pool has
// a thread a core and runs the custom call from a thread of its own, so one helper a pool thread put a third
// runnable thread on two cores, each call then paying for the OS switching them (a 4-row decode step 18% slower).
template <typename Work>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, Work work) {
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto counters = std::make_shared<Counters>();
  auto run = [counters, n](auto& fn) {
    for (int64_t i; (i = counters->next.fetch_add(1)) < n;) {
      fn(i);
      counters->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, n - 1);
  auto shared_work = std::make_shared<Work>(work);
  for (int64_t i = 0; i < helpers; ++i) {
    pool.Schedule([counters, n, shared_work, run]() mutable {
      if (counters->next.load() < n) run(*shared_work);
    });
  }
  run(work);
  while (counters->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

// Runs work(i, next) for i in 0 .. n (n < 2^32) over `participants` threads (the calling thread and
// participants - 1 of the pool's, participants <= pool.num_threads()), for work that reads a stream in index order:
// participant p owns the p-th contiguous run of the indices and takes them front to back; with its own run done, it
// takes the others' from their backs (a late or slowed thread's share is not waited for). next: the index this
// thread will likely run after i (-1: none), whose data are worth asking for while i runs. A run is one 64-bit word
// (front in the low half, back in the high half) that owner and thieves move with compare-and-swap. A Scope is
// constructed on a participant's thread before its first index and destroyed after its last (AMX's tile state).
struct NoScope {};

template <typename Scope = NoScope, typename Work>
void ParallelRuns(xla::ffi::ThreadPool& pool, int64_t n, int64_t participants, Work work) {
  struct Runs {
    explicit Runs(int64_t count) : bounds(static_cast<size_t>(count)) {}
    std::vector<std::atomic<uint64_t>> bounds;
  };
  const auto pack = [](uint64_t front, uint64_t back) { return front | back << 32; };
  const auto front_of = [](uint64_t run) { return static_cast<int64_t>(run & 0xffffffffu); };
  const auto back_of = [](uint64_t run) { return static_cast<int64_t>(run >> 32); };
  participants = std::clamp<int64_t>(participants, 1, std::max<int64_t>(n, 1));
  auto runs = std::make_shared<Runs>(participants);
  for (int64_t p = 0; p < participants; ++p)
    runs->bounds[p].store(pack(p * n / participants, (p + 1) * n / participants));
  // Takes the front (from_back false) or back index of a run, or -1 when it is empty.
  const auto take = [=](std::atomic<uint64_t>& run, bool from_back) -> int64_t {
    uint64_t now = run.load();
    while (front_of(now) < back_of(now)) {
      const int64_t f = front_of(now), b = back_of(now);
      if (run.compare_exchange_weak(now, from_back ? pack(f, b - 1) : pack(f + 1, b))) return from_back ? b - 1 : f;
    }
    return -1;
  };
  ParallelFor(pool, participants, [=](int64_t p) {
    [[maybe_unused]] const Scope scope;
    std::atomic<uint64_t>& own = runs->bounds[p];
    for (int64_t i; (i = take(own, false)) >= 0;) work(i, i + 1 < back_of(own.load()) ? i + 1 : -1);
    for (int64_t q = (p + 1) % participants; q != p; q = (q + 1) % participants) {
      std::atomic<uint64_t>& other = runs->bounds[q];
      for (int64_t i; (i = take(other, true)) >= 0;) work(i, i - 1 >= front_of(other.load()) ? i - 1 : -1);
    }
  });
}

}  // namespace jaxllm

#endif  // JAXLLM_PALLAS_KERNELS_PARALLEL_FOR_H_
