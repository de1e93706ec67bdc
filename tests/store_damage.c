/* store_damage.c — test helper: flips the lowest bit of sample N's first stored latent value in place (still finite,
   no longer what its checksum covers); with DATASET /text_2 or /image, its first value of that caption source.
   usage: tests/store_damage STORE SAMPLE [DATASET] */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/store.h"

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s STORE SAMPLE [/latents | /text_2 | /image]\n", argv[0]);
        return 2;
    }
    store s;
    if (store_open(&s, argv[1], stderr) != 0) return 1;
    const long long id = strtoll(argv[2], NULL, 10);
    ALDIT_CHECK(id >= 0 && id < s.n_samples, "%s: sample %lld is not in the store (%lld samples)", argv[1], id,
                (long long)s.n_samples);
    const char *dataset = argc == 4 ? argv[3] : "/latents";
    hsize_t element = (hsize_t)s.samples[id].latent_offset;
    const hsize_t one = 1;
    if (strcmp(dataset, "/latents") != 0) {
        ALDIT_CHECK(s.has_sources, "%s: no caption sources", argv[1]);
        const int image = strcmp(dataset, "/image") == 0;
        ALDIT_CHECK(image || strcmp(dataset, "/text_2") == 0, "unknown dataset %s", dataset);
        ALDIT_CHECK(image ? s.sources[id].image_len > 0 : s.sources[id].text_2_len > 0, "%s: sample %lld has no %s rows",
                    argv[1], id, dataset);
        element = (hsize_t)(image ? s.sources[id].image_offset : s.sources[id].text_2_offset);
    }
    store_close(&s);

    hid_t file, latents, type, space, memory;
    H5_CHECK(file = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT));
    H5_CHECK(latents = H5Dopen2(file, dataset, H5P_DEFAULT));
    H5_CHECK(type = H5Dget_type(latents)); /* the stored type: the bytes stay as they are but one bit */
    H5_CHECK(space = H5Dget_space(latents));
    H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, &element, NULL, &one, NULL));
    H5_CHECK(memory = H5Screate_simple(1, &one, NULL));
    unsigned char value[16] = {0};
    ALDIT_CHECK(H5Tget_size(type) <= sizeof value, "%s: unexpected latent type size", argv[1]);
    H5_CHECK(H5Dread(latents, type, memory, space, H5P_DEFAULT, value));
    value[0] ^= 1u; /* little-endian: the lowest mantissa bit */
    H5_CHECK(H5Dwrite(latents, type, memory, space, H5P_DEFAULT, value));
    H5_CHECK(H5Sclose(memory));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Tclose(type));
    H5_CHECK(H5Dclose(latents));
    H5_CHECK(H5Fclose(file));
    return 0;
}
