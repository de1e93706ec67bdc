// carver.cuh — hands out LAYOUT_GPU_ALIGN-aligned pieces of one device allocation (the GPU models' arenas), or only
// counts them: the memory formula's padding (model/layout.h) is this alignment.
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

}  // namespace

#endif
