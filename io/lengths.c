/* lengths.c — length spec parser (FILE:LINE errors), weighted seeded shape draws. */
#include "io/lengths.h"
#include "core/check.h"
#include "core/rng.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


/* Parse one integer field of a spec line; 0 on success. */
static int parse_dim(const char *text, int32_t *value)
{
    char *end = NULL;
    errno = 0;
    long parsed = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || parsed < 1 || parsed > LENGTHS_MAX_DIM) return 1;
    *value = (int32_t)parsed;
    return 0;
}

/* Parse an integer in [1, max] that ends at `stop` (a character of the text, or '\0'); 0 on success, *end after it. */
static int parse_bounded(const char *text, long max, char stop, int32_t *value, const char **end)
{
    char *after = NULL;
    errno = 0;
    long parsed = strtol(text, &after, 10);
    if (errno != 0 || after == text || *after != stop || parsed < 1 || parsed > max || !(text[0] >= '0' && text[0] <= '9'))
        return 1;
    *value = (int32_t)parsed;
    if (end) *end = after;
    return 0;
}

/* The caption field: `L` or `MIN-MAX`. */
static int parse_text(const char *text, length_bucket *bucket, char *why, size_t why_size)
{
    const char *end = NULL;
    const int range = strchr(text, '-') != NULL;
    int bad = parse_bounded(text, LENGTHS_MAX_TEXT, range ? '-' : '\0', &bucket->text_min, &end);
    if (!bad && range) bad = parse_bounded(end + 1, LENGTHS_MAX_TEXT, '\0', &bucket->text_max, NULL);
    if (!bad && !range) bucket->text_max = bucket->text_min;
    if (!bad && bucket->text_min <= bucket->text_max) return 0;
    snprintf(why, why_size, "text '%s' is not a caption length L or a range MIN-MAX of integers in [1, %d], MIN <= MAX",
             text, LENGTHS_MAX_TEXT);
    return 1;
}

/* Parse one non-comment, non-blank line into `bucket`; on error writes the reason into `why`. */
static int parse_line(char *line, length_bucket *bucket, char *why, size_t why_size)
{
    static const char *names[3] = {"frames", "height", "width"};
    char *fields[5] = {0};
    int n_fields = 0;
    for (char *token = strtok(line, " \t\r\n"); token; token = strtok(NULL, " \t\r\n")) {
        if (n_fields < 5) fields[n_fields] = token;
        n_fields++;
    }
    if (n_fields != 4 && n_fields != 5) {
        snprintf(why, why_size, "expected 4 or 5 fields `weight frames height width [text]`, found %d", n_fields);
        return 1;
    }
    bucket->text_min = bucket->text_max = 0;
    if (n_fields == 5 && parse_text(fields[4], bucket, why, why_size)) return 1;
    char *end = NULL;
    errno = 0;
    bucket->weight = strtod(fields[0], &end);
    if (errno != 0 || end == fields[0] || *end != '\0' || !isfinite(bucket->weight) || bucket->weight <= 0.0) {
        snprintf(why, why_size, "weight '%s' is not a positive finite number", fields[0]);
        return 1;
    }
    int32_t *dims[3] = {&bucket->frames, &bucket->height, &bucket->width};
    for (int i = 0; i < 3; i++) {
        if (parse_dim(fields[1 + i], dims[i])) {
            snprintf(why, why_size, "%s '%s' is not an integer in [1, %d]", names[i], fields[1 + i], LENGTHS_MAX_DIM);
            return 1;
        }
    }
    return 0;
}

int lengths_load(const char *path, length_bucket **buckets, int *n_buckets, FILE *errors)
{
    *buckets = NULL;
    *n_buckets = 0;
    FILE *file = fopen(path, "r");
    if (!file) {
        fprintf(errors, "%s: cannot open length spec: %s\n", path, strerror(errno));
        return 1;
    }
    int n_errors = 0, capacity = 0, line_number = 0, sum_reported = 0;
    double weight_sum = 0.0;
    length_bucket *list = NULL;
    char line[4096];
    while (fgets(line, sizeof line, file)) {
        line_number++;
        size_t length = strlen(line);
        if (length == sizeof line - 1 && line[length - 1] != '\n' && !feof(file)) {
            fprintf(errors, "%s:%d: line longer than %zu characters\n", path, line_number, sizeof line - 2);
            n_errors++;
            int c;
            while ((c = fgetc(file)) != EOF && c != '\n') {}
            continue;
        }
        char *comment = strchr(line, '#');
        if (comment) *comment = '\0';
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        length_bucket bucket;
        char why[256];
        if (parse_line(line, &bucket, why, sizeof why)) {
            fprintf(errors, "%s:%d: %s\n", path, line_number, why);
            n_errors++;
            continue;
        }
        weight_sum += bucket.weight;
        if (!sum_reported && !(weight_sum <= LENGTHS_MAX_WEIGHT_SUM)) { /* also catches a sum that overflowed */
            fprintf(errors, "%s:%d: the weights so far sum to %g, more than %g (weights are relative: scale them down)\n",
                    path, line_number, weight_sum, LENGTHS_MAX_WEIGHT_SUM);
            n_errors++;
            sum_reported = 1;
        }
        if (*n_buckets == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            list = xrealloc(list, (size_t)capacity * sizeof *list);
        }
        list[(*n_buckets)++] = bucket;
    }
    if (ferror(file)) {
        fprintf(errors, "%s: read error: %s\n", path, strerror(errno));
        n_errors++;
    }
    fclose(file);
    if (n_errors == 0 && *n_buckets == 0) {
        fprintf(errors, "%s: no buckets (expected lines `weight frames height width`)\n", path);
        n_errors++;
    }
    if (n_errors) {
        free(list);
        *n_buckets = 0;
        return n_errors;
    }
    *buckets = list;
    return 0;
}

void lengths_draw(const length_bucket *buckets, int n_buckets, int64_t n_samples, uint64_t seed,
                  int32_t *frames, int32_t *height, int32_t *width)
{
    lengths_draw_text(buckets, n_buckets, n_samples, seed, frames, height, width, NULL);
}

void lengths_draw_text(const length_bucket *buckets, int n_buckets, int64_t n_samples, uint64_t seed,
                       int32_t *frames, int32_t *height, int32_t *width, int32_t *text)
{
    double *cumulative = xmalloc((size_t)n_buckets * sizeof *cumulative);
    double total = 0.0;
    for (int b = 0; b < n_buckets; b++) cumulative[b] = (total += buckets[b].weight);
    uint64_t state = rng_hash(seed, 0x6c656e67), text_state = rng_hash(seed, 0x74657874);
    for (int64_t i = 0; i < n_samples; i++) {
        double target = rng_uniform(&state) * total;
        int low = 0, high = n_buckets - 1; /* first bucket whose cumulative weight exceeds target */
        while (low < high) {
            int middle = (low + high) / 2;
            if (cumulative[middle] > target) high = middle; else low = middle + 1;
        }
        frames[i] = buckets[low].frames;
        height[i] = buckets[low].height;
        width[i] = buckets[low].width;
        if (!text) continue;
        const uint64_t span = (uint64_t)(buckets[low].text_max - buckets[low].text_min) + 1;
        const uint64_t draw = rng_next_u64(&text_state) % span;   /* drawn for every sample: one stream position each */
        text[i] = buckets[low].text_min > 0 ? buckets[low].text_min + (int32_t)draw : 0;
    }
    free(cumulative);
}
