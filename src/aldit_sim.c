/* aldit_sim.c — placeholder for the aldit-sim tool. */
int main(void) { return 0; }
