// gelu.cuh — the tanh GELU (PyTorch's approximate='tanh', the constants of cpu_gelu_tanh_fwd) and its derivative, in
// fp32, for the kernels that apply either (gemm.cu's epilogue stand-ins, fp8.cu's casts).
#ifndef ALDIT_GELU_CUH
#define ALDIT_GELU_CUH

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float v)
{
    return 0.5f * v * (1.0f + tanhf(kGeluSqrt2OverPi * (v + kGeluCubic * v * v * v)));
}

__device__ __forceinline__ float gelu_tanh_grad(float v)
{
    const float t = tanhf(kGeluSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float du_dv = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du_dv;
}

#endif
