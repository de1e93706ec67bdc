/* model.h — placeholder, filled in by its area */
