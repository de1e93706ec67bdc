/* cli.c — aldit's command line: options, the deck path and its overrides; --help and --version text. */
#include "config.h"
#include "deck/cli.h"
#include "core/check.h"
#include "deck/deck.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

/* Prints the usage error for the option getopt_long just refused (opterr is off); `word` is the argument
   it was reading. */
static void report_bad_option(const char *word, FILE *errors)
{
    if (strncmp(word, "--", 2) != 0) fprintf(errors, "aldit: unknown option '-%c'\n", optopt);
    else if (optopt == 0) fprintf(errors, "aldit: unknown option '%s'\n", word); /* unknown or ambiguous */
    else fprintf(errors, "aldit: option '%s' takes no value\n", word);
}

int cli_parse(int argc, char **argv, cli_args *out, FILE *errors)
{
    static const struct option options[] = {{"help", no_argument, NULL, 'h'}, {"version", no_argument, NULL, 'V'},
                                            {"check", no_argument, NULL, 'c'}, {NULL, 0, NULL, 0}};
    int n_errors = 0, want_help = 0, want_version = 0, want_check = 0, n_positional = 0;
    *out = (cli_args){.mode = CLI_RUN};
    char **positional = xcalloc((size_t)argc + 1, sizeof *positional);
    opterr = 0;
    optind = 0; /* 0, not 1: glibc then resets all of getopt's state (cli_parse may run more than once) */
    /* "-" first: words that are not options come back in order as 1, wherever the options sit */
    for (;;) {
        int word = optind == 0 ? 1 : optind, option = getopt_long(argc, argv, "-hV", options, NULL);
        if (option == -1) break;
        switch (option) {
        case 1: positional[n_positional++] = optarg; break;
        case 'h': want_help = 1; break;
        case 'V': want_version = 1; break;
        case 'c': want_check = 1; break;
        default: report_bad_option(argv[word], errors); n_errors++; break;
        }
    }
    for (int i = optind; i < argc; i++) positional[n_positional++] = argv[i]; /* the words after "--" */
    /* the deck and its overrides move to the front of argv, in order */
    for (int i = 0; i < n_positional; i++) argv[1 + i] = positional[i];
    free(positional);
    if (n_positional > 0) {
        out->deck_path = argv[1];
        out->n_overrides = n_positional - 1;
        out->overrides = &argv[2];
    }
    if (want_help) out->mode = CLI_HELP;
    else if (want_version) out->mode = CLI_VERSION;
    else {
        out->mode = want_check ? CLI_CHECK : CLI_RUN;
        if (!out->deck_path) {
            fprintf(errors, "aldit: no deck given\n");
            n_errors++;
        }
    }
    if (n_errors > 0) fprintf(errors, "usage: aldit [--check] DECK [section.key=value ...]; aldit --help for more\n");
    return n_errors;
}

void cli_print_help(FILE *out)
{
    fputs("usage: mpirun -np N aldit [--check] DECK [section.key=value ...]\n"
          "       aldit --help | --version\n"
          "\n"
          "Train a Wan 2.1-style video diffusion transformer on an HDF5 latent store across MPI ranks,\n"
          "with a load balancer that packs samples of any length onto ranks by predicted cost.\n"
          "\n"
          "options:\n"
          "  --check        validate the deck and the store, print the resolved configuration and the\n"
          "                 balance plan, and exit\n"
          "  -h, --help     this text\n"
          "  -V, --version  version and build options\n"
          "  --             end of options (for a deck whose name starts with '-')\n"
          "\n"
          "DECK is an INI file (see docs/input-deck.md). Each section.key=value after it overrides the\n"
          "deck, e.g. `aldit run.ini train.lr=3e-4 run.steps=1000`. Relative paths are relative to the\n"
          "current directory, except log.metrics (relative to run.dir).\n"
          "\n"
          "exit status: 0 done, 1 runtime error, 2 bad command line, deck or store.\n"
          "\n"
          "deck keys (section.key = default):\n",
          out);
    deck_print_help(out);
}

void cli_print_version(FILE *out)
{
    fprintf(out, "aldit %s\nbuild options: %s\n", PACKAGE_VERSION, ALDIT_BUILD_OPTIONS);
}
