/* aldit_store.c — placeholder for the aldit-store tool. */
int main(void) { return 0; }
