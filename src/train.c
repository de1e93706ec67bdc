/* train.c — placeholder, filled in by its area */
