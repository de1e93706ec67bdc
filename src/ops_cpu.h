/* ops_cpu.h — placeholder, filled in by its area */
