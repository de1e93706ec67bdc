/* main.c — the aldit driver: command line, deck, then training on every rank. */
#include "config.h"
#include "check.h"
#include "comm.h"
#include "deck.h"

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    (void)info;
    comm_finalize();
    return 0;
}
