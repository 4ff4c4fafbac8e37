"""The `longrope` command line: argument parsing, one module per group of subcommands, and everything that
draws on a terminal (rich consoles and progress bars). Nothing below the command line imports this package."""
