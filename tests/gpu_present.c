/* gpu_present.c — prints how many GPUs this process can use (0 without a driver or device); tests/train_gpu.sh asks it. */
#include <stdio.h>

#include "cuda/gpu.h"

int main(void)
{
    printf("%d\n", gpu_count());
    return 0;
}
