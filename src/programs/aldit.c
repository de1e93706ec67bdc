/* main.c — the aldit driver: command line, deck (read by rank 0, broadcast), then --check or training. */
#include "config.h"
#include "core/check.h"
#include "deck/cli.h"
#include "core/comm.h"
#include "deck/deck.h"
#include "train/train.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    train_install_signal_handlers();
    /* every rank parses; only rank 0 says what is wrong */
    FILE *quiet = info.rank == 0 ? NULL : fopen("/dev/null", "w");
    cli_args args;
    int usage_errors = cli_parse(argc, argv, &args, quiet ? quiet : stderr);
    if (quiet) fclose(quiet);
    int status = 0;
    if (usage_errors > 0) status = ALDIT_EXIT_USAGE;
    else if (args.mode == CLI_HELP || args.mode == CLI_VERSION) {
        if (info.rank == 0) {
            if (args.mode == CLI_HELP) cli_print_help(stdout);
            else cli_print_version(stdout);
        }
    } else {
        deck config;
        deck_load_bcast(&config, args.deck_path, args.n_overrides, args.overrides);
        status = args.mode == CLI_CHECK ? train_check(&config, &info) : train_run(&config, &info);
    }
    fflush(stdout);
    comm_finalize();
    return status;
}
