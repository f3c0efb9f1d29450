"""Who may call what: credentials and their checks."""
