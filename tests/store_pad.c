/* store_pad.c — test helper: copies a store with every caption's text zero-padded to ROWS rows (text_len = ROWS), as
   Wan 2.1 pads them. usage: tests/store_pad IN OUT ROWS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/store.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s IN OUT ROWS\n", argv[0]);
        return 2;
    }
    store in;
    if (store_open(&in, argv[1], stderr) != 0) return 1;
    const int32_t rows = (int32_t)strtol(argv[3], NULL, 10);
    store_writer *out = store_writer_create(argv[2], in.text_dim, in.text_precision, stderr);
    if (!out) return 1;
    float *latent = xmalloc((size_t)in.max_latent_elements * sizeof *latent);
    float *text = xcalloc((size_t)rows * (size_t)in.text_dim, sizeof *text);
    for (int64_t id = 0; id < in.n_samples; id++) {
        const store_sample *sample = &in.samples[id];
        ALDIT_CHECK(sample->text_len <= rows, "%s: sample %lld has %d text rows, more than %d", argv[1], (long long)id,
                    sample->text_len, rows);
        memset(text, 0, (size_t)rows * (size_t)in.text_dim * sizeof *text);
        if (store_read_sample(&in, id, latent, text, stderr) != 0) return 1;
        if (store_writer_add(out, sample->channels, sample->frames, sample->height, sample->width, latent, rows, text))
            return 1;
    }
    free(latent);
    free(text);
    store_close(&in);
    return store_writer_close(out) != 0;
}
