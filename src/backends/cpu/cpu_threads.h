// The CPU backend's one way of running a pass on several threads, shared by the forward
// (cpu_backend.cpp) and the backward (cpu_backward.cpp): the calling thread plus up to threads - 1
// new ones, joined before it returns. Only the std::thread objects are allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>

namespace flashattn {
namespace cpu {

// Calls work(slot) for slots 0 .. threads - 1 (slot 0 on the calling thread, each other on a new
// thread) and returns when every call has. A thread that cannot be created leaves its share to the
// others: workers take their items from a shared counter, so a missing slot only slows the pass.
// `work` must not throw.
template <class Work>
void run_on_threads(int64_t threads, const Work &work) {
    std::unique_ptr<std::thread[]> pool;
    int64_t started = 0;
    if (threads > 1) {
        pool.reset(new (std::nothrow) std::thread[static_cast<size_t>(threads - 1)]);
        if (pool) {
            for (int64_t i = 1; i < threads; ++i) {
                try {
                    const size_t slot = static_cast<size_t>(i);
                    pool[static_cast<size_t>(started)] = std::thread([&work, slot] { work(slot); });
                    ++started;
                } catch (...) {
                    break;
                }
            }
        }
    }
    work(0);
    for (int64_t i = 0; i < started; ++i) pool[static_cast<size_t>(i)].join();
}

}  // namespace cpu
}  // namespace flashattn
