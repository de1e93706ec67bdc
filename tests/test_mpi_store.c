/* test_mpi_store.c — run under mpirun by mpi_store.sh: store_open_bcast on every rank, then each rank reads
   every sample through its own file handle. usage: test_mpi_store STORE; rank 0 prints "store agrees on N
   ranks" and every rank exits 0 when all ranks hold the same index and read the same sample bytes; a bad
   store makes store_open_bcast end every rank with status 2. */
#include "core/comm.h"
#include "io/store.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    if (argc != 2) {
        if (info.rank == 0) fprintf(stderr, "usage: test_mpi_store STORE\n");
        comm_finalize();
        return 2;
    }
    store s;
    store_open_bcast(&s, argv[1]);
    uint32_t index_crc = store_crc32(0, s.samples, (size_t)s.n_samples * sizeof *s.samples);
    uint32_t data_crc = 0;
    int read_failed = 0;
    float *latent = malloc((size_t)s.max_latent_elements * sizeof *latent);
    float *text = malloc((size_t)s.max_text_elements * sizeof *text);
    for (int64_t id = 0; id < s.n_samples && !read_failed; id++) {
        read_failed = store_verify_sample(&s, id, latent, text, stderr);
        data_crc = store_crc32(data_crc, latent, (size_t)store_sample_latent_elements(&s.samples[id]) * sizeof *latent);
        data_crc = store_crc32(data_crc, text, (size_t)store_sample_text_elements(&s, &s.samples[id]) * sizeof *text);
    }
    /* equal everywhere iff max and -min agree for each value */
    double values[6] = {(double)index_crc, (double)data_crc, (double)s.n_samples,
                        -(double)index_crc, -(double)data_crc, -(double)s.n_samples};
    comm_allreduce_max_f64(values, 6);
    int agree = values[0] == -values[3] && values[1] == -values[4] && values[2] == -values[5];
    int any_failed = comm_allreduce_or_int(read_failed || !agree);
    if (info.rank == 0) {
        if (any_failed) printf("store differs across ranks or a read failed\n");
        else printf("store agrees on %d ranks: %lld samples, index crc 0x%08x, data crc 0x%08x\n", info.n_ranks,
                    (long long)s.n_samples, (unsigned)index_crc, (unsigned)data_crc);
    }
    free(latent);
    free(text);
    store_close(&s);
    comm_finalize();
    return any_failed;
}
