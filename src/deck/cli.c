/* cli.c — aldit's command line: options, the deck path and its overrides; --help and --version text. */
#include "config.h"
#include "deck/cli.h"
#include "deck/deck.h"

#include <string.h>

int cli_parse(int argc, char **argv, cli_args *out, FILE *errors)
{
    int n_errors = 0, want_help = 0, want_version = 0, want_check = 0, options_done = 0, n_positional = 0;
    *out = (cli_args){.mode = CLI_RUN};
    for (int i = 1; i < argc; i++) {
        char *argument = argv[i];
        if (!options_done && argument[0] == '-' && argument[1] != '\0') {
            if (strcmp(argument, "--") == 0) options_done = 1;
            else if (strcmp(argument, "--help") == 0 || strcmp(argument, "-h") == 0) want_help = 1;
            else if (strcmp(argument, "--version") == 0 || strcmp(argument, "-V") == 0) want_version = 1;
            else if (strcmp(argument, "--check") == 0) want_check = 1;
            else {
                fprintf(errors, "aldit: unknown option '%s'\n", argument);
                n_errors++;
            }
        } else {
            /* options may sit anywhere: the deck and its overrides move to the front of argv, in order */
            argv[1 + n_positional++] = argument;
        }
    }
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
