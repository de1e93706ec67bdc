/* lengths.h — placeholder, filled in by its area */
