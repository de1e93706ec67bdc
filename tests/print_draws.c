/* print_draws.c — test helper: aldit's per-sample timestep and task draws of epoch 0 (prefetch_sigma, prefetch_i2v,
   the sample taken as eligible for image-to-video) for sample ids 0 .. N-1, one line "id sigma i2v" each (sigma as
   %.9g), under the noise seed a run of run.seed = SEED draws from (train.c: rng_hash(seed, "noise")).
   usage: tests/print_draws SEED SHIFT uniform|logit_normal I2V_SHARE N */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "train/prefetch.h"

#define NOISE_STREAM_TAG 0x6E6F697365ull /* train.c's "noise" */

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s SEED SHIFT uniform|logit_normal I2V_SHARE N\n", argv[0]);
        return 2;
    }
    const prefetch_noise noise = {.noise_seed = rng_hash(strtoull(argv[1], NULL, 10), NOISE_STREAM_TAG),
                                  .timestep_shift = atof(argv[2]),
                                  .logit_normal = strcmp(argv[3], "logit_normal") == 0,
                                  .i2v_share = atof(argv[4]), .threads = 1};
    const long n = atol(argv[5]);
    for (long id = 0; id < n; id++)
        printf("%ld %.9g %d\n", id, (double)prefetch_sigma(&noise, 0, id), prefetch_i2v(&noise, 0, id, 1));
    return 0;
}
