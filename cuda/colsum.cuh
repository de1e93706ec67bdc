// colsum.cuh — the last pass of the deterministic column sums: per-block partials of each column added in a fixed order.
#ifndef ALDIT_COLSUM_CUH
#define ALDIT_COLSUM_CUH

constexpr int kPartialColumns = 32;  // columns per block of the last pass
constexpr int kPartialSlices = 8;    // each column's partials split over this many slices
constexpr int kPartialThreads = kPartialColumns * kPartialSlices;

namespace {

// sums[c] = (accumulate ? sums[c] : 0) + sum over k of partial[k][c] for the columns
// [kPartialColumns * blockIdx.x, +kPartialColumns): partial k goes to slice k % kPartialSlices, each slice
// adds its partials in order, then the slices are added in order (the same bits on every run). Launch
// with (cols + kPartialColumns - 1) / kPartialColumns blocks of kPartialThreads threads.
__global__ void __launch_bounds__(kPartialThreads) column_partials_kernel(const float *partial, int n_partials,
                                                                          int cols, float *sums, int accumulate)
{
    __shared__ float slice_sums[kPartialSlices][kPartialColumns];
    const int lane = threadIdx.x % kPartialColumns, slice = threadIdx.x / kPartialColumns;
    const int column = blockIdx.x * kPartialColumns + lane;
    float total = 0.0f;
    if (column < cols)
        for (int k = slice; k < n_partials; k += kPartialSlices) total += partial[(long long)k * cols + column];
    slice_sums[slice][lane] = total;
    __syncthreads();
    if (slice == 0 && column < cols) {
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < kPartialSlices; ++s) sum += slice_sums[s][lane];
        sums[column] = accumulate ? sums[column] + sum : sum;
    }
}

}  // namespace

#endif
