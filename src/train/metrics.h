/* metrics.h — the JSON-lines metrics file: each line built in memory and written whole, a torn line never kept. */
#ifndef ALDIT_METRICS_H
#define ALDIT_METRICS_H

#include <stdint.h>

typedef struct metrics_file metrics_file;

/* Rank 0 (the metrics), or each rank its own file ([log] micro_batches). resumed_step = 0: a new, empty file at
   `path`. resumed_step > 0: the file keeps its lines of steps up to resumed_step (later ones are about to be recomputed, so no step appears twice) and drops any line
   without its '\n' (a torn last line of a run that died while writing it); missing, it is created.
   A file that cannot be opened or rewritten ends the job naming it ([log] metrics). */
metrics_file *metrics_open(const char *path, int64_t resumed_step);

/* Append printf-formatted text to the line being built (in memory; nothing is written yet). */
void metrics_add(metrics_file *m, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* End the line ('\n') and write it with one write(2). Returns 0, or the errno of a failed or short write
   (disk full, quota, file size limit), in which case the file is cut back to where the line began: the
   file holds whole lines only. The line buffer is empty afterwards either way. */
int metrics_end_line(metrics_file *m);

/* Close (m may be NULL). Returns 0 or the errno of a failed close. */
int metrics_close(metrics_file *m);

#endif
