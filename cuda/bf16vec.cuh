// bf16vec.cuh — device helpers shared by the CUDA kernels: 16-byte vectors of 8 bf16 <-> 8 floats.
#ifndef ALDIT_BF16VEC_CUH
#define ALDIT_BF16VEC_CUH

#include <cuda_bf16.h>
#include <stdint.h>

constexpr int kVecElems = 8;  // bf16 values in one 16-byte vector

__device__ __forceinline__ void unpack8(const uint4 &u, float (&f)[kVecElems])
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        f[2 * j] = __uint_as_float(w[j] << 16);
        f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[kVecElems])
{
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
        w[j] = *reinterpret_cast<uint32_t *>(&pair);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

#endif
