"""A job's life: the lifecycle (preflight, lock, Ray, interrupts), its errors as one line, its console, flags and progress lines."""
