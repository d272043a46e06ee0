"""The `lopd` command line: flags -> validated config -> stages.<stage>.run(config)."""
