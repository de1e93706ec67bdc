/* store.h — placeholder, filled in by its area */
