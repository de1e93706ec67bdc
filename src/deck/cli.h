/* cli.h — aldit's command line: `aldit [options] DECK [section.key=value ...]`, --help and --version text. */
#ifndef ALDIT_CLI_H
#define ALDIT_CLI_H

#include <stdio.h>

typedef enum {
    CLI_RUN,     /* train */
    CLI_CHECK,   /* --check: validate the deck and the store, print the configuration and the plan, exit */
    CLI_HELP,    /* --help */
    CLI_VERSION  /* --version */
} cli_mode;

typedef struct {
    cli_mode mode;
    const char *deck_path;   /* NULL for --help / --version */
    int n_overrides;         /* `section.key=value` arguments after the deck (checked by deck_load) */
    char **overrides;        /* point into argv (cli_parse moves the deck and overrides to its front) */
} cli_args;

/* Parse argv; options may come anywhere (`--` ends them). Returns 0, or the number of usage errors, each printed to `errors` followed by a hint
   to run --help; the caller then exits with status 2 (ALDIT_EXIT_USAGE). */
int cli_parse(int argc, char **argv, cli_args *out, FILE *errors);

/* Usage, options, exit codes and every deck key with its default and meaning. */
void cli_print_help(FILE *out);

/* "aldit VERSION" and the build options configure found. */
void cli_print_version(FILE *out);

#endif
