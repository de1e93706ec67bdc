/* gpu_present.c — prints how many GPU ranks this node's tests may start: the GPUs visible (0 without a driver or device), or, where several ranks may share one GPU through NCCL (a build with NCCL 2.30.3+ and NCCL_MULTI_RANK_GPU_ENABLE=1: gradsync_ranks_may_share_gpu), 4 per GPU. The GPU tests ask it; `--why` adds a line to stderr saying which. */
#include <stdio.h>
#include <string.h>

#include "cuda/gpu.h"
#include "cuda/gradsync.h"

enum { kRanksPerSharedGpu = 4 };

int main(int argc, char **argv)
{
    const int gpus = gpu_count();
    int version = 0;
    const int share = gpus > 0 && gradsync_ranks_may_share_gpu(&version) && version > 0; /* NCCL built in */
    printf("%d\n", share ? gpus * kRanksPerSharedGpu : gpus);
    if (argc > 1 && strcmp(argv[1], "--why") == 0)
        fprintf(stderr, "%d GPU(s) visible; NCCL %d.%d.%d; ranks %s share a GPU\n", gpus, version / 10000,
                version / 100 % 100, version % 100, share ? "may" : "may not");
    return 0;
}
