/* checkpoint.h — placeholder, filled in by its area */
