/* group_blocks.h — a test hook of the balancer: every micro-batch of an aligned block of k ranks run by the block's
   sequence-parallel group (the training tests force groups with it where the planner has not chosen them). */
#ifndef ALDIT_GROUP_BLOCKS_H
#define ALDIT_GROUP_BLOCKS_H

#include "balance/balance.h"

/* Rewrite `a` (as balancer_next made it, every micro_group 1) so that each of the first n_blocks aligned blocks of k
   ranks (all of them when n_blocks < 0), base .. base+k-1 with base % k == 0, runs all its micro-batches together:
   every member's list holds the block's micro-batches, in rank then micro-batch order, the same ids on each,
   micro_group k; the ranks past those blocks keep theirs, alone. global_samples is unchanged (each sample once); a
   member's predicted seconds are the block's sum over k and its peak memory the block's largest. k = 1 or n_blocks
   = 0: nothing changes. k not a power of two, or not dividing the ranks, or a micro_group already above 1: fatal (a
   test's mistake). */
void balance_group_blocks(balance_assignment *a, int k, int n_blocks);

#endif
