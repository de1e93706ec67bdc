/* balance.c — placeholder, filled in by its area */
