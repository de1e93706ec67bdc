/* ops_cpu.c — placeholder, filled in by its area */
