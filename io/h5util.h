/* h5util.h — HDF5 helpers shared by the store and the checkpoints: HDF5's own error-stack printing off while
   our code reports its own messages. */
#ifndef ALDIT_H5UTIL_H
#define ALDIT_H5UTIL_H

#include <hdf5.h>

#include "core/check.h"

typedef struct { H5E_auto2_t function; void *data; } h5_auto_print;

static inline h5_auto_print h5_quiet_begin(void)
{
    h5_auto_print saved;
    H5_CHECK(H5Eget_auto2(H5E_DEFAULT, &saved.function, &saved.data));
    H5_CHECK(H5Eset_auto2(H5E_DEFAULT, NULL, NULL));
    return saved;
}

static inline void h5_quiet_end(h5_auto_print saved) { H5_CHECK(H5Eset_auto2(H5E_DEFAULT, saved.function, saved.data)); }

#endif
