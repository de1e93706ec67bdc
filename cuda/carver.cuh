// carver.cuh — hands out LAYOUT_GPU_ALIGN-aligned pieces of one device allocation (the GPU models' arenas), or only
// counts them: the memory formula's padding (model/layout.h) is this alignment; and the sequence-parallel head
// layout's per-block attention tensors, carved alike by both GPU models.
#ifndef ALDIT_CARVER_CUH
#define ALDIT_CARVER_CUH

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "model/layout.h"
}

namespace {

// With base NULL it only counts (used ends as the bytes the pieces take).
struct carver {
    static constexpr size_t kAlign = LAYOUT_GPU_ALIGN;
    char *base;
    size_t used;
    template <typename T> T *take(int64_t count)
    {
        T *piece = base ? reinterpret_cast<T *>(base + used) : nullptr;
        used += ((size_t)(count > 0 ? count : 0) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
        return piece;
    }
};

// Per block (`layers` of them) a head layout's set of attention tensors at this member's heads, in this order: q, k, v
// and the output (s.*out), rows x dk values each, then the log-sum-exps, rows x hk fp32. The blocks from n_sets on
// share set 0 (block recomputation, which re-runs the exchange with each block: n_sets 1).
template <typename Set, typename T>
void carve_head_sets(carver &c, Set *sets, T *Set::*out, int layers, int n_sets, int64_t rows, int64_t dk, int64_t hk)
{
    for (int l = 0; l < layers; ++l) {
        Set &s = sets[l];
        if (l >= n_sets) {
            s = sets[0];
            continue;
        }
        T **tensors[] = {&s.q, &s.k, &s.v, &(s.*out)};
        for (T **p : tensors) *p = c.take<T>(rows * dk);
        s.lse = c.take<float>(rows * hk);
    }
}

}  // namespace

#endif
