/* checkpoint_test_util.h — what the checkpoint tests share: the captured error text and a count of a folder's files (include after cmocka.h). */
#ifndef ALDIT_TEST_CHECKPOINT_UTIL_H
#define ALDIT_TEST_CHECKPOINT_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Everything written to `errors` so far, as a string (caller frees). */
static inline char *captured(FILE *errors)
{
    long n_bytes = ftell(errors);
    char *text = calloc((size_t)n_bytes + 1, 1);
    rewind(errors);
    assert_int_equal(fread(text, 1, (size_t)n_bytes, errors), (size_t)n_bytes);
    return text;
}

/* Files in `dir` whose names end in `suffix`. */
static inline int count_files(const char *dir, const char *suffix)
{
    DIR *listing = opendir(dir);
    assert_non_null(listing);
    int n_files = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        size_t length = strlen(entry->d_name), suffix_length = strlen(suffix);
        if (length >= suffix_length && strcmp(entry->d_name + length - suffix_length, suffix) == 0) n_files++;
    }
    closedir(listing);
    return n_files;
}

#endif
