"""The three stores and their clients: both Redis roles (single, Cluster, Sentinel), the
PostgreSQL pool and migrations, the command coalescer, embedded dev/test servers, the
topology checks."""
